package service_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// TestCallbackLaneTakesNoOutsideJobs: a callback lane signs what it sends
// with its signing secret, so its receivers take a signed callback for a
// record the throttler settled. Only the throttler stores jobs on it: a
// submission over HTTP (single or batch) is refused with 403 naming the
// lane and stores nothing, and a job published on its public NATS subject
// is dead-lettered unsent. The real callbacks still go.
func TestCallbackLaneTakesNoOutsideJobs(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, _ := recordsTarget(t)
	recv := newCallbackReceiver(t)
	cfg := callbacksConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL, recv.srv.URL)
	svc, _ := servicetest.Start(t, cfg, nil)
	addr := svc.Addr()
	forged := `{"v":1,"id":"order-1","lane":"demo","state":"delivered","attempts":[]}`

	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/callbacks/jobs", strings.NewReader(forged))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "demo.order-1.callback")
	req.Header.Set("Throttle-URL", recv.srv.URL+"/hooks/forged")
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var p api.Problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Content-Type") != "application/problem+json" || p.Field != "lane" {
		t.Errorf("a submission to the callback lane: %d %s %+v, want a 403 problem naming lane", resp.StatusCode, resp.Header.Get("Content-Type"), p)
	}
	batch := `[{"idempotency_key":"forged-2","payload":` + forged + `,"url":"` + recv.srv.URL + `/hooks/forged"}]`
	resp, err = pollClient.Post("http://"+addr+"/v1/lanes/callbacks/jobs:batch", "application/json", strings.NewReader(batch))
	if err != nil {
		t.Fatal(err)
	}
	c := jobCall{code: resp.StatusCode}
	_ = json.NewDecoder(resp.Body).Decode(new(any))
	resp.Body.Close()
	if c.code != http.StatusForbidden {
		t.Errorf("a batch to the callback lane: %d, want 403", c.code)
	}

	// Over NATS, on the lane's public subject.
	nc, err := nats.Connect(natsSrv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("throttle.callbacks")
	m.Header.Set("Throttle-URL", recv.srv.URL+"/hooks/forged-nats")
	m.Header.Set("Nats-Msg-Id", "forged-3")
	m.Data = []byte(forged)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}

	// A real callback, after the forged ones: the lane is FIFO, so the
	// forged ones would have gone first.
	if c := submitWithCallback(t, addr, "demo", "real-1", recv.srv.URL+"/hooks/real", "x"); c.code != http.StatusAccepted {
		t.Fatalf("submit: %d %q", c.code, c.body)
	}
	testenv.Eventually(t, 20*time.Second, "the real callback", func() bool { return len(recv.to("/hooks/real")) == 1 })
	verifySigned(t, recv.to("/hooks/real")[0])
	var dead api.DeadLetters
	testenv.Eventually(t, 20*time.Second, "the published job dead-lettered", func() bool {
		dead = api.DeadLetters{}
		keyCall(t, "GET", addr, "/v1/lanes/callbacks/dead", "", &dead)
		return len(dead.Dead) > 0
	})
	if d := dead.Dead[0]; d.ID != "forged-3" || !strings.Contains(d.Reason, "callback_lane") {
		t.Errorf("dead letter %+v, want forged-3, unsent, its reason naming the callback lane", d)
	}
	if n, k := len(recv.to("/hooks/forged")), len(recv.to("/hooks/forged-nats")); n+k != 0 {
		t.Errorf("the receiver got %d forged callbacks over HTTP and %d over NATS; want none", n, k)
	}
}
