package config_test

import (
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
)

// TestCallers: the callers section's defaults, and every refusal names its
// field and the file.
func TestCallers(t *testing.T) {
	key := func(plan string) string {
		return "auth:\n  keys: [{id: shop, sha256: " + sum("s") + ", scopes: [submit], plan: " + plan + "}]\n"
	}
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"Contract", good + "callers:\n  per_ip: {limit: 120, window: 1m}\n  trusted_proxies: [10.0.0.0/8, \"::1\"]\n  plans: {free: {rate: 10/min, burst: 10, observe: false}}\n" + key("free"), ""},
		{"UnknownPlan", good + "callers: {plans: {free: {rate: 10/min}}}\n" + key("gold"), `t.yaml: auth.keys[0].plan: no plan named "gold" in callers.plans`},
		{"PlanWithoutCallers", good + key("gold"), ""},
		{"BadRate", good + "callers: {plans: {free: {rate: 10/week}}}\n", "t.yaml: callers.plans.free.rate: line"},
		{"NoRate", good + "callers: {plans: {free: {burst: 3}}}\n", "t.yaml: callers.plans.free.rate: is required"},
		{"ZeroBurst", good + "callers: {plans: {free: {rate: 10/min, burst: -1}}}\n", "t.yaml: callers.plans.free.burst:"},
		{"BadProxy", good + "callers: {trusted_proxies: [\"10.0.0.0/33\"]}\n", "t.yaml: callers.trusted_proxies[0]:"},
		{"BadWindow", good + "callers: {per_ip: {limit: 5, window: 1500ms}}\n", "t.yaml: callers.per_ip.window:"},
		{"NegativeLimit", good + "callers: {per_ip: {limit: -1}}\n", "t.yaml: callers.per_ip.limit:"},
		{"DefaultPlanUnknown", good + "callers: {default_plan: gold}\n", "t.yaml: callers.default_plan:"},
		{"Typo", good + "callers: {plan: {}}\n", "field plan not found in callers"},
		{"LaneCost", withLane("cost: 0"), ""},
		{"LaneCostTooHigh", withLane("cost: 1001"), "t.yaml: lanes[0].cost:"},
	} {
		t.Run(tc.name, func(t *testing.T) { parseWants(t, tc.yaml, nil, tc.want) })
	}
}

func TestCallersDefaults(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(good+"callers: {plans: {free: {rate: 10/min}}}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Callers
	if c.PerIP.Limit != 120 || c.PerIP.Window.D() != time.Minute {
		t.Errorf("per_ip %+v, want 120 per 1m", *c.PerIP)
	}
	if c.Plans["free"].Burst != 10 {
		t.Errorf("free burst %d, want the rate's count 10", c.Plans["free"].Burst)
	}
	if a, ok := c.Plans[config.DefaultAnonymousPlan]; !ok || a != config.DefaultAnonymous {
		t.Errorf("anonymous plan %+v", c.Plans)
	}
	if cfg.Lanes[0].Cost != 1 {
		t.Errorf("lane cost %d, want 1", cfg.Lanes[0].Cost)
	}
	off, err := config.Parse("t.yaml", []byte(good), nil)
	if err != nil || off.Callers != nil {
		t.Fatalf("no callers section: %+v %v", off.Callers, err)
	}
	zero, err := config.Parse("t.yaml", []byte(good+"callers: {per_ip: {limit: 0}}\n"), nil)
	if err != nil || zero.Callers.PerIP.Quota().On() {
		t.Fatalf("limit 0: %+v %v", zero.Callers.PerIP, err)
	}
}
