package service_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// callersConfig is a one-lane config on the nats-server at natsURL and the
// Redis at redisURL, with key shop (secret "shop-secret") on plan free,
// 10/min, and the per-IP layer at perIP per minute.
func callersConfig(t *testing.T, natsURL, redisURL, target string, perIP int) config.Config {
	t.Helper()
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, data_dir: %q}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
auth:
  keys:
    - {id: shop, sha256: %s, scopes: [submit], plan: free}
    - {id: ops, sha256: %s, scopes: [admin]}
callers:
  per_ip: {limit: %d, window: 1m}
  plans: {free: {rate: 10/min, burst: 10}}
lanes:
  - name: demo
    rate: 100
    burst: 10
    target: {http: {url: %q}}
`, natsURL, t.TempDir(), redisURL, hexSum("shop-secret"), hexSum("ops-secret"), perIP, target)
	cfg, err := config.Parse("callers.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestCallerQuotasAcrossInstances: three instances sharing one Redis hold
// one plan bucket per key and one window per IP between them; with Redis
// away each instance answers from its own memory (fail open per
// instance), and counts it.
//
// Counts only: the plan refills a token every 6 s and the per-IP window
// is a minute long, far longer than the 43 requests take on a loaded
// machine.
func TestCallerQuotasAcrossInstances(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	ns := testenv.StartNATS(t)
	rs := testenv.StartRedis(t)
	var addrs []string
	for range 3 {
		svc, _ := start(t, callersConfig(t, ns.ClientURL(), rs.URL(), rec.srv.URL+"/hook", 40))
		addrs = append(addrs, svc.Addr())
	}
	client := &http.Client{Timeout: 10 * time.Second}
	codes := map[int]int{}
	for i := range 30 {
		codes[call(t, client, "POST", "http://"+addrs[i%3]+"/v1/lanes/demo/jobs", "shop-secret", "{}")]++
	}
	if codes[202] != 10 || codes[429] != 20 {
		t.Fatalf("30 jobs of one key over 3 instances: %v, want 10 × 202 and 20 × 429", codes)
	}
	// The IP has made 30 requests; 10 more pass the per-IP layer (and
	// fail auth), the 41st is refused before it.
	for i := range 10 {
		if code := call(t, client, "POST", "http://"+addrs[i%3]+"/v1/lanes/demo/jobs", "wrong", "{}"); code != 401 {
			t.Fatalf("request %d with a bad key: %d, want 401", 31+i, code)
		}
	}
	for i := range 3 {
		if code := call(t, client, "POST", "http://"+addrs[i]+"/v1/lanes/demo/jobs", "wrong", "{}"); code != 429 {
			t.Fatalf("instance %d, over the per-IP limit with a bad key: %d, want 429", i, code)
		}
	}
	// Redis away: each instance falls back to its own memory (its own
	// per-IP window and plan bucket), so requests go through again.
	rs.Stop(t)
	if code := call(t, client, "POST", "http://"+addrs[0]+"/v1/lanes/demo/jobs", "shop-secret", "{}"); code != 202 {
		t.Fatalf("with Redis away: %d, want 202 from the instance's memory", code)
	}
	m, _ := servicetest.Scrape(t, addrs[0], "ops-secret")
	// One check for the job (the scrape, with a valid key, is not
	// checked).
	if v, ok := m.Get("throttler_caller_quota_fallbacks_total"); !ok || v != 1 {
		t.Fatalf("fallbacks not counted:\n%s", m.Grep("throttler_caller_quota_fallbacks_total"))
	}
	if v, ok := m.Get(`throttler_caller_rejections_total{lane="demo",layer="plan",plan="free"}`); !ok || v != 6 {
		t.Fatalf("instance 0's plan rejections:\n%s", m.Grep("throttler_caller_rejections_total"))
	}
}

// TestCallerPlansReload: Reload (SIGHUP) reads the callers section of the
// config file again; the next request sees the new plan.
func TestCallerPlansReload(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "throttler.yaml")
	write := func(rate string) {
		y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {data_dir: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
auth:
  keys: [{id: shop, sha256: %s, scopes: [submit], plan: free}]
callers:
  plans: {free: {rate: %s, burst: 1}}
lanes:
  - name: demo
    rate: 100
    target: {http: {url: %q}}
`, filepath.Join(dir, "data"), hexSum("shop-secret"), rate, rec.srv.URL+"/hook")
		if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1/h")
	cfg, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(cfg, nil, nil)
	svc.ReloadConfigWith(func() (config.Config, error) { return config.Load(path, nil) })
	servicetest.Run(t, svc)
	client := &http.Client{Timeout: 10 * time.Second}
	url := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"
	for i, want := range []int{202, 429} {
		if code := call(t, client, "POST", url, "shop-secret", "{}"); code != want {
			t.Fatalf("request %d on 1/h: %d, want %d", i+1, code, want)
		}
	}
	write("1000/s")
	if err := svc.Reload(); err != nil {
		t.Fatal(err)
	}
	// A fresh plan state is not implied: the bucket keeps its tat, but at
	// 1000/s the next token is 1 ms away.
	waitFor(t, 5*time.Second, "a 202 on the reloaded plan", func() bool {
		return call(t, client, "POST", url, "shop-secret", "{}") == 202
	})
}
