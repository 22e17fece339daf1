package service_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// TestReplicasOnEveryStream: nats.replicas reaches every stream and
// consumer the service makes, and with 3 on a three-node cluster the lane
// keeps taking and delivering jobs after the server that led its stream
// is killed.
func TestReplicasOnEveryStream(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartNATSCluster(t, 3)
	var delivered atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { delivered.Add(1) }))
	t.Cleanup(target.Close)
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, replicas: 3}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 50
    burst: 5
    target: {http: {url: %q}}
`, cluster.URLs(), target.URL)
	cfg, err := config.Parse("replicas.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := runWithRegistry(t, cfg, prometheus.NewRegistry())

	nc, js := testenv.JetStream(t, cluster.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{queue.StreamName("demo"), queue.RetryStream, queue.DeadStream} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
		want := map[string]string{queue.StreamName("demo"): queue.ConsumerName, queue.RetryStream: "retry-demo"}[name]
		if want == "" {
			continue
		}
		c, err := st.Consumer(ctx, want)
		if err != nil {
			t.Fatalf("consumer %s of %s: %v", want, name, err)
		}
		if r := c.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("consumer %s of %s has %d replicas, want 3", want, name, r)
		}
	}
	nc.Close()

	cluster.Kill(t, cluster.StreamLeader(t, queue.StreamName("demo")))
	cluster.StreamLeader(t, queue.StreamName("demo")) // a new one elected
	// Submissions may meet a 503 while the client reconnects; each id is
	// retried until it is accepted, as a client would.
	accepted := 0
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < 20; {
		req, _ := http.NewRequest("POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("after-kill-%d", i))
		resp, err := pollClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				accepted++
				i++
				continue
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d not accepted within 30s of the kill: %v %v", i, resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for delivered.Load() < int64(accepted) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs delivered within 30s of the kill", delivered.Load(), accepted)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
