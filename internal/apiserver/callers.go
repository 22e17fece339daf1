package apiserver

import (
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/redisquota"
)

// CallersConfig is what the caller quotas need besides the callers
// section.
type CallersConfig struct {
	// Redis, when set, keeps the fleet's shared state; nil: this
	// instance's memory.
	Redis *redis.AutoPipeliner
	// Lanes is the lanes' state store. When it is the Redis store and
	// Redis is not a cluster, a single job's lane peek is folded into the
	// caller check's script (LanesFold).
	Lanes   bucket.Store
	Metrics *metrics.Metrics
	// LaneNames names every lane, for series at 0 from the start.
	LaneNames []string
	// Clock spaces the fallback warnings; nil: clock.Real.
	Clock clock.Clock
}

// fallbackLogEvery spaces the warnings of checks that fell back to memory.
const fallbackLogEvery = 10 * time.Second

// Callers builds the API's caller quotas, or nil without a callers
// section: with Redis, the fleet's shared state, falling back to this
// instance's memory while Redis is away (each check counted, a warning at
// most every 10 s); else memory.
func (s *Server) Callers(c CallersConfig) *ingest.Callers {
	if s.cfg.Callers == nil {
		s.log.Info("caller quotas off: the config has no callers section")
		return nil
	}
	if c.Clock == nil {
		c.Clock = clock.Real
	}
	fold := LanesFold(c.Lanes, s.cfg.Redis.Mode)
	var lim quota.Limiter = &quota.Memory{}
	if c.Redis != nil {
		log := s.log.With("component", "callers")
		var mu sync.Mutex
		var last time.Time
		var missed int
		lim = &quota.Failover{
			Primary: redisquota.New(c.Redis, redisquota.Config{Lanes: fold}),
			Local:   lim,
			OnFallback: func(err error) {
				c.Metrics.Callers.Fallbacks.Inc()
				mu.Lock()
				defer mu.Unlock()
				missed++
				if now := c.Clock.Now(); now.Sub(last) >= fallbackLogEvery {
					log.Warn("redis unavailable: caller quotas are enforced per instance from memory (fail open per instance)",
						"checks_since_last_log", missed, "err", config.ScrubURL(err.Error(), s.cfg.Redis.URL))
					last, missed = now, 0
				}
			},
		}
	}
	p := CallerPolicy(s.cfg.Callers)
	s.log.Info("caller quotas on", "per_ip", p.PerIP.Limit, "window", p.PerIP.Length.String(), "plans", len(p.Plans),
		"anonymous_plan", p.AnonymousPlan, "trusted_proxies", len(p.TrustedProxies), "shared", c.Redis != nil, "lane_in_same_script", fold != nil)
	return &ingest.Callers{Limiter: lim, Lanes: c.LaneNames, Policy: p}
}

// LanesFold is the lane store the caller quotas fold a single job's lane
// peek into (one round trip for the caller check and the lane's decision):
// the Redis store, unless Redis is a cluster, where the lanes' keys and the
// {callers} keys sit on different slots and no script may touch both; nil
// then, and the lane is peeked in a call of its own.
func LanesFold(store bucket.Store, mode string) redisquota.Lanes {
	if rs, ok := store.(*redisbucket.Store); ok && mode != "cluster" {
		return rs
	}
	return nil
}

// CallerPolicy turns a validated callers section into the API's policy.
func CallerPolicy(c *config.Callers) ingest.CallerPolicy {
	p := ingest.CallerPolicy{
		PerIP: c.PerIP.Quota(), ObserveIP: c.PerIP.Observe, TrustedProxies: c.TrustedPrefixes(),
		Plans: map[string]ingest.Plan{}, AnonymousPlan: c.AnonymousPlan, DefaultPlan: c.DefaultPlan,
	}
	for name, pl := range c.Plans {
		p.Plans[name] = ingest.Plan{Rate: pl.Rate, Burst: pl.Burst, Observe: pl.Observe}
	}
	return p
}
