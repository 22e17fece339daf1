package config

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/quota"
)

// Callers are the caller quotas (package quota), which protect the
// throttler and its tenants: a caller over them gets 429, while lane limits
// queue. Without a callers section they are off.
type Callers struct {
	// PerIP is the pre-auth layer, per client IP; left out it is
	// DefaultPerIP, and limit 0 turns it off.
	PerIP *PerIP `yaml:"per_ip"`
	// TrustedProxies are the networks (CIDRs) of the proxies in front of
	// the throttler: only a request whose socket peer is in one of them
	// has its client IP read from X-Forwarded-For or Forwarded.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// Plans map a plan name to its token bucket.
	Plans map[string]Plan `yaml:"plans"`
	// AnonymousPlan names the plan that anonymous callers (an API without
	// keys) share, each client IP a bucket of its own; DefaultAnonymousPlan
	// when left out. Without a plan of that name DefaultAnonymous applies.
	AnonymousPlan string `yaml:"anonymous_plan"`
	// DefaultPlan is the plan of a key that names none; empty: such keys
	// have no per-key limit (the per-IP layer still applies).
	DefaultPlan string `yaml:"default_plan"`
}

// PerIP is the per-IP layer: at most Limit requests per client IP in any
// Window (sliding).
type PerIP struct {
	Limit  int64    `yaml:"limit"`
	Window Duration `yaml:"window"`
	// Observe computes, logs and counts the layer's refusals without
	// enforcing them.
	Observe bool `yaml:"observe"`
}

// Plan is one caller plan: a rate in the quota syntax and a burst.
type Plan struct {
	Rate bucket.Rate `yaml:"rate"`
	// Burst is how many tokens an idle caller may spend at once; left out,
	// the rate's whole count per window (10 for 10/min).
	Burst int `yaml:"burst"`
	// Observe computes, logs and counts the plan's refusals without
	// enforcing them.
	Observe bool `yaml:"observe"`
}

// Defaults of the callers section.
var (
	DefaultPerIP = PerIP{Limit: 120, Window: Duration(time.Minute)}
	// DefaultAnonymousPlan is the name of the anonymous callers' plan.
	DefaultAnonymousPlan = "anonymous"
	// DefaultAnonymous is the anonymous plan when none is configured:
	// stricter than a plan one would give a key.
	DefaultAnonymous = Plan{Rate: mustRate("30/min"), Burst: 10}
)

func mustRate(s string) bucket.Rate {
	r, err := bucket.ParseRate(s)
	if err != nil {
		panic(err)
	}
	return r
}

// Limit is the plan's bucket for package quota.
func (p Plan) Limit() bucket.Limit { return bucket.Limit{Rate: p.Rate.PerSecond(), Burst: p.Burst} }

// Quota is the per-IP layer for package quota.
func (p PerIP) Quota() quota.Window {
	return quota.Window{Limit: p.Limit, Length: p.Window.D()}
}

// applyDefaults fills what the callers section leaves out.
func (c *Callers) applyDefaults() {
	if c.PerIP == nil {
		d := DefaultPerIP
		c.PerIP = &d
	}
	if c.PerIP.Limit > 0 && c.PerIP.Window == 0 {
		c.PerIP.Window = DefaultPerIP.Window
	}
	if c.AnonymousPlan == "" {
		c.AnonymousPlan = DefaultAnonymousPlan
	}
	if c.Plans == nil {
		c.Plans = map[string]Plan{}
	}
	if _, ok := c.Plans[c.AnonymousPlan]; !ok {
		c.Plans[c.AnonymousPlan] = DefaultAnonymous
	}
	for name, p := range c.Plans {
		p.defaults()
		c.Plans[name] = p
	}
}

func (p *Plan) defaults() {
	if p.Burst == 0 && !p.Rate.IsZero() {
		n, _ := p.Rate.Quota()
		p.Burst = max(int(n), 1)
	}
}

// ValidatePlan checks one plan; field names its place ("callers.plans.free",
// or the admin API's "rate"/"burst" with an empty prefix). The one check
// of a plan, for the file and for the admin API.
func ValidatePlan(prefix string, p Plan) error {
	join := func(f string) string {
		if prefix == "" {
			return f
		}
		return prefix + "." + f
	}
	if p.Rate.IsZero() {
		return &Error{Field: join("rate"), Msg: "is required: a rate like 10/min, 1200/min or 5/s"}
	}
	if err := p.Limit().Validate(); err != nil {
		if le := (*bucket.LimitError)(nil); errors.As(err, &le) {
			return &Error{Field: join(le.Field), Msg: le.Msg, Err: err}
		}
		return &Error{Field: join("rate"), Msg: err.Error(), Err: err}
	}
	return nil
}

// validate checks the callers section.
func (c *Callers) validate() error {
	fail := func(field, format string, args ...any) error {
		return &Error{Field: "callers." + field, Msg: fmt.Sprintf(format, args...)}
	}
	if err := c.PerIP.Quota().Validate(); err != nil {
		if le, ok := err.(*bucket.LimitError); ok {
			return fail("per_ip."+le.Field, "%s", le.Msg)
		}
		return fail("per_ip", "%v", err)
	}
	for i, n := range c.TrustedProxies {
		if _, err := netip.ParsePrefix(n); err != nil {
			if _, aerr := netip.ParseAddr(n); aerr != nil {
				return fail(fmt.Sprintf("trusted_proxies[%d]", i), "%q is not a CIDR prefix (10.0.0.0/8) or an address", n)
			}
		}
	}
	names := make([]string, 0, len(c.Plans))
	for name := range c.Plans {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !quota.ValidPlanName(name) {
			return fail("plans", "plan name %q must be 1-64 letters, digits, '_' or '-'", name)
		}
		if err := ValidatePlan("callers.plans."+name, c.Plans[name]); err != nil {
			return err
		}
	}
	if !quota.ValidPlanName(c.AnonymousPlan) {
		return fail("anonymous_plan", "%q must be 1-64 letters, digits, '_' or '-'", c.AnonymousPlan)
	}
	if _, ok := c.Plans[c.DefaultPlan]; c.DefaultPlan != "" && !ok {
		return fail("default_plan", "no plan named %q in callers.plans", c.DefaultPlan)
	}
	return nil
}

// TrustedPrefixes returns callers.trusted_proxies as prefixes (an address
// is a /32 or /128); valid after Validate.
func (c *Callers) TrustedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, n := range c.TrustedProxies {
		if p, err := netip.ParsePrefix(n); err == nil {
			out = append(out, p.Masked())
		} else if a, err := netip.ParseAddr(n); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}

// plan returns the plan named name.
func (c *Callers) plan(name string) (Plan, bool) {
	if c == nil {
		return Plan{}, false
	}
	p, ok := c.Plans[name]
	return p, ok
}
