package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/testenv"
)

// TestFleetStartsTogether: three instances started at the same moment
// against a fresh three-node cluster with R3 streams (a Deployment's
// replicas all start at once) all become ready, none exits while the
// cluster places the streams and buckets they all create at once, and a
// job submitted to each is delivered.
func TestFleetStartsTogether(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartNATSCluster(t, 3)
	rs := testenv.StartRedis(t)
	tg := newTarget(t)
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, replicas: 3}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
%s`, cluster.URLs(), rs.URL(), laneYAML("demo", bucket.Limit{Rate: 50, Burst: 5}, tg.URL("demo"))+laneYAML("other", bucket.Limit{Rate: 50, Burst: 5}, tg.URL("other")))
	svcs := make([]*service.Service, 3)
	logs := make([]*testenv.LogBuffer, 3)
	errs := make([]error, 3)
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	var ready sync.WaitGroup
	for i := range svcs {
		cfg, err := config.Parse(fmt.Sprintf("i%d.yaml", i), []byte(y), nil)
		if err != nil {
			t.Fatal(err)
		}
		logs[i] = &testenv.LogBuffer{}
		svcs[i] = service.New(cfg, slog.New(slog.NewTextHandler(logs[i], &slog.HandlerOptions{Level: slog.LevelInfo})), nil)
	}
	exited := make(chan int, 3)
	for i, svc := range svcs {
		running.Add(1)
		ready.Add(1)
		go func() {
			defer running.Done()
			errs[i] = svc.Run(ctx)
			exited <- i
		}()
		go func() {
			defer ready.Done()
			select {
			case <-svc.Ready():
			case <-ctx.Done():
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		running.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("i%d: Run: %v", i, err)
			}
			if t.Failed() {
				t.Logf("i%d log:\n%s", i, logs[i].String())
			}
		}
	})
	allReady := make(chan struct{})
	go func() { ready.Wait(); close(allReady) }()
	select {
	case <-allReady:
	case i := <-exited:
		t.Fatalf("i%d exited while starting: %v", i, errs[i])
	case <-time.After(60 * time.Second):
		t.Fatal("not every instance ready after 60s")
	}
	c := newClient(t, addrs(svcs)...)
	deadline := time.Now().Add(10 * time.Second)
	for i := range svcs {
		if !c.submit("demo", fmt.Sprintf("j%d", i), i, deadline) {
			t.Fatalf("job j%d not accepted by i%d", i, i)
		}
	}
	waitDelivered(t, c, tg, 30*time.Second)
}
