package backend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler/throttler/internal/backend"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/testenv"
)

// TestProbeSetsBackendHealth: with a real nats-server and redis-server the
// probe reports both up with a round trip; Redis stopped, its gauge goes to
// 0 and its error count up, while NATS stays up.
func TestProbeSetsBackendHealth(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redisSrv := testenv.StartRedis(t)
	nc, err := nats.Connect(natsSrv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := backend.OpenRedis(ctx, config.Redis{URL: redisSrv.URL()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m := metrics.New(prometheus.NewRegistry())
	p := backend.Probe{
		Checks: []backend.Check{
			{Name: metrics.BackendNATS, Ping: nc.FlushWithContext},
			{Name: metrics.BackendRedis, Ping: func(ctx context.Context) error { return r.Client.Ping(ctx).Err() }},
		},
		Every: 20 * time.Millisecond, Timeout: 500 * time.Millisecond, Metrics: m.Backends,
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	up := func(b string) float64 { return testutil.ToFloat64(m.Backends.Up.WithLabelValues(b)) }
	testenv.Eventually(t, 5*time.Second, "both backends up", func() bool {
		return up(metrics.BackendNATS) == 1 && up(metrics.BackendRedis) == 1
	})
	for _, b := range []string{metrics.BackendNATS, metrics.BackendRedis} {
		if rtt := testutil.ToFloat64(m.Backends.RTT.WithLabelValues(b)); rtt <= 0 || rtt > 0.5 {
			t.Errorf("%s round trip %v s, want in (0, 0.5]", b, rtt)
		}
	}
	redisSrv.Stop(t)
	testenv.Eventually(t, 10*time.Second, "redis down", func() bool { return up(metrics.BackendRedis) == 0 })
	if n := testutil.ToFloat64(m.Backends.Probes.WithLabelValues(metrics.BackendRedis, "error")); n < 1 {
		t.Errorf("%v redis probe errors counted", n)
	}
	if up(metrics.BackendNATS) != 1 {
		t.Error("NATS went down with Redis")
	}
}
