package queue

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/testenv"
)

// TestReadBatchRefusesAPartialAnswer: readBatch takes a real server's
// answer to a batch direct get whole, and refuses it with its first
// message lost (as a reconnect while the server sends it can) or one in
// the middle: the reader must not trust a range it did not see.
func TestReadBatchRefusesAPartialAnswer(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	nc, js := testenv.JetStream(t, srv.ClientURL())
	ctx := context.Background()
	prefix := InternalSubject("demo", "") + "."
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AHEAD", Subjects: []string{prefix + ">"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "a", "c"} {
		if _, err := js.Publish(ctx, prefix+key, []byte(key)); err != nil {
			t.Fatal(err)
		}
	}
	body, _ := json.Marshal(scanReq{Seq: 1, NextBy: prefix + ">", Batch: 10})
	inbox := nats.NewInbox()
	answers := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, answers)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET.AHEAD", inbox, body); err != nil {
		t.Fatal(err)
	}
	var got []*nats.Msg
	for len(got) == 0 || got[len(got)-1].Header.Get(hdrStatus) != statusEOB {
		select {
		case m := <-answers:
			got = append(got, m)
		case <-time.After(5 * time.Second):
			t.Fatalf("no EOB after %d answers", len(got))
		}
	}
	if len(got) != 5 {
		t.Fatalf("%d answers, want 4 messages and the EOB", len(got))
	}
	msgs, end, err := readBatch(got, 1, aheadParser(prefix))
	if err != nil || len(msgs) != 4 || end.last != 4 || msgs[1].key != "b" {
		t.Fatalf("the whole answer: %+v, last %d, %v", msgs, end.last, err)
	}
	for name, part := range map[string][]*nats.Msg{
		"first lost":  got[1:],
		"second lost": append([]*nats.Msg{got[0]}, got[2:]...),
		"third lost":  append(append([]*nats.Msg{}, got[:2]...), got[3:]...),
	} {
		if msgs, _, err := readBatch(part, 1, aheadParser(prefix)); err == nil || !strings.Contains(err.Error(), "missing") {
			t.Errorf("%s: %d messages, %v; want it refused", name, len(msgs), err)
		}
	}
}
