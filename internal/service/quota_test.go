package service_test

import (
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
)

// TestQuotaHoldsAtTheTarget: a lane configured with its target's quota (12
// starts in any second, 3 at once) derives its limit, shows both in the
// lanes API, and no 1-s window at the target ever holds more than 12 starts
// while a burst of 30 drains.
func TestQuotaHoldsAtTheTarget(t *testing.T) {
	rec := newRecorder(t)
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {data_dir: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    quota: {limit: 12, per: 1s, burst: 3}
    target: {http: {url: %q}}
`, t.TempDir(), rec.srv.URL+"/hook")
	cfg, err := config.Parse("quota.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := start(t, cfg)
	st := lanesOf(t, svc.Addr())[0]
	if st.Quota == nil || st.Quota.Limit != 12 || st.Quota.Per != "1s" || st.Quota.Burst != 3 || st.Burst != 3 || st.Rate != 8 {
		t.Fatalf("lanes API shows %+v (quota %+v), want quota 12/1s burst 3 and the derived 8/s burst 3", st, st.Quota)
	}
	answers := burst(t, svc.Addr(), "demo", "q", 30)
	for i, a := range answers {
		if a.code != http.StatusAccepted {
			t.Fatalf("job %d: %d", i, a.code)
		}
	}
	waitFor(t, 15*time.Second, "30 deliveries", func() bool { return len(rec.snapshot()) >= 30 })
	var at []time.Time
	for _, a := range rec.snapshot() {
		at = append(at, a.at)
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < time.Second; j++ {
			n++
		}
		if n > 12 {
			t.Fatalf("%d starts in the second from arrival %d: over the quota of 12", n, i)
		}
	}
}
