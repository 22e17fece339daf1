// Package api holds the wire types of the throttler's HTTP API: what the
// server writes and a client reads, in one place so that the two cannot
// drift apart. It has no behaviour and no dependencies; docs/API.md and
// docs/openapi.yaml describe the same shapes.
package api

import "time"

// JobState is the state of a job in an Accepted answer (and a batch
// item's): StateAdmitted, StateQueued or StateScheduled. It is a string on
// the wire.
type JobState string

// Job states in an Accepted answer.
const (
	// StateAdmitted: the job started at once.
	StateAdmitted JobState = "admitted"
	// StateQueued: the job waits its turn; ETAMillis estimates the wait.
	StateQueued JobState = "queued"
	// StateScheduled: the job asked for a delay (Throttle-Delay,
	// Throttle-Not-Before); it is stored and enters its lane's queue when
	// due. ETAMillis counts the delay.
	StateScheduled JobState = "scheduled"
)

// Accepted is the 202 body of a job submission: the job is stored durably.
type Accepted struct {
	ID    string   `json:"id"`
	Lane  string   `json:"lane"`
	State JobState `json:"state"`
	// ETAMillis estimates the wait until the job starts; 0 when admitted.
	ETAMillis int64 `json:"eta_ms"`
	// Duplicate: a job with the same id was already stored; nothing new
	// was queued.
	Duplicate bool `json:"duplicate,omitempty"`
}

// LaneStatus is one lane in GET /v1/lanes.
type LaneStatus struct {
	Name string  `json:"name"`
	Rate float64 `json:"rate"`
	// EffectiveRate is the rate the lane drains at now: rate, or less while
	// adaptive mode has slowed it down.
	EffectiveRate float64 `json:"effective_rate"`
	Burst         int     `json:"burst"`
	MaxInflight   int     `json:"max_inflight"`
	MaxBacklog    int64   `json:"max_backlog"`
	// Quota, when the lane was configured with its target's quota, is that
	// quota; Rate and Burst were derived from it.
	Quota  *Quota `json:"quota,omitempty"`
	Target string `json:"target"`
	// Results: the lane keeps job records (GET /v1/lanes/{lane}/jobs).
	Results bool `json:"results,omitempty"`
	// Keyed is the per-key part of a keyed lane (per_key); absent on
	// others.
	Keyed *KeyedStatus `json:"keyed,omitempty"`
	// Backlog: jobs stored and not yet done (waiting or in flight), all
	// instances.
	Backlog uint64 `json:"backlog"`
	// Waiting: jobs no instance has fetched yet.
	Waiting uint64 `json:"waiting"`
	// InFlight: jobs fetched by some instance and not yet answered.
	InFlight int `json:"in_flight"`
	// Delivered: jobs this instance delivered since it started.
	Delivered uint64 `json:"delivered"`
	// Dead: jobs in the lane's dead-letter stream.
	Dead uint64 `json:"dead"`
	// Retrying: jobs in the retry stream, failed jobs waiting for their
	// next attempt and delayed jobs not yet due.
	Retrying uint64 `json:"retrying"`
	// Paused: the lane's drain cannot reserve slots (state store away) or a
	// downstream asked it to wait.
	Paused      bool   `json:"paused"`
	PauseReason string `json:"pause_reason,omitempty"`
	// PausedByOperator: an operator holds the lane (PATCH
	// {"paused": true}) on every instance until resumed; jobs are still
	// taken and queued. Paused is true as well.
	PausedByOperator bool `json:"paused_by_operator"`
	// PausedUntil, while a downstream's pause holds the lane, is when it
	// ends.
	PausedUntil *time.Time `json:"paused_until,omitempty"`
	// Adaptive: the lane's adaptive mode is on (EffectiveRate follows the
	// target's rate-limit answers).
	Adaptive bool `json:"adaptive"`
	// Utilization: this instance's starts over the last minute divided by
	// what the configured rate allows in it (the
	// throttler_lane_utilization gauge); a lane drained by several
	// instances sums theirs.
	Utilization float64 `json:"utilization"`
	// Recent429: answers 429 Too Many Requests from the lane's target to
	// this instance over the last Recent429Seconds.
	Recent429        uint64 `json:"recent_429"`
	Recent429Seconds int    `json:"recent_429_seconds"`
	// Error says why some live counts are missing (JetStream away).
	Error string `json:"error,omitempty"`
	// CallerUtilization, with caller quotas on, is the jobs callers
	// submitted to the lane through this instance over the last minute,
	// divided by what the lane's rate drains in a minute.
	CallerUtilization *float64 `json:"caller_utilization,omitempty"`
}

// PlanStatus is one caller plan, in GET /v1/lanes and GET
// /v1/callers/plans.
type PlanStatus struct {
	Name string `json:"name"`
	// Rate is the plan's rate as written ("10/min").
	Rate    string `json:"rate"`
	Burst   int    `json:"burst"`
	Observe bool   `json:"observe"`
	// Utilization is the tokens the plan's callers took through this
	// instance over the last minute, divided by what the plan allows the
	// callers active in it (Callers).
	Utilization float64 `json:"utilization"`
	Callers     int     `json:"callers"`
}

// Plans is the body of GET /v1/callers/plans.
type Plans struct {
	Plans []PlanStatus `json:"plans"`
	// AnonymousPlan is the plan anonymous callers share, per client IP.
	AnonymousPlan string `json:"anonymous_plan"`
	// DefaultPlan is the plan of keys that name none; "" for none.
	DefaultPlan string `json:"default_plan,omitempty"`
	// KeyPlans are the plans set through PUT /v1/callers/keys/{key}/plan
	// since the last reload, by key id.
	KeyPlans map[string]string `json:"key_plans,omitempty"`
	// PerIP is the per-IP layer: limit requests per window_seconds; limit
	// 0 when off.
	PerIP PerIP `json:"per_ip"`
}

// PerIP is the per-IP layer of the caller quotas.
type PerIP struct {
	Limit         int64 `json:"limit"`
	WindowSeconds int64 `json:"window_seconds"`
	Observe       bool  `json:"observe"`
}

// KeyedStatus describes a keyed lane's per-key defaults and its keys on the
// answering instance.
type KeyedStatus struct {
	PerKeyRate        float64 `json:"per_key_rate"`
	PerKeyBurst       int     `json:"per_key_burst"`
	PerKeyMaxInflight int     `json:"per_key_max_inflight"`
	Ordered           bool    `json:"ordered"`
	// KeysActive: keys with jobs that the answering instance reads;
	// KeysPaused: of those, keys a downstream asked to wait.
	KeysActive int `json:"keys_active"`
	KeysPaused int `json:"keys_paused"`
	// Keys are the busiest keys of the lane, cluster-wide: the ones with
	// the most jobs stored, most first (at most BusiestKeys).
	Keys []KeyBacklog `json:"keys,omitempty"`
}

// BusiestKeys is how many keys a keyed lane's status lists.
const BusiestKeys = 5

// KeyBacklog is one key of a keyed lane and the jobs it has stored
// (waiting or in flight), from JetStream.
type KeyBacklog struct {
	Key     string `json:"key"`
	Backlog uint64 `json:"backlog"`
}

// KeyStatus is one key of a keyed lane (GET|PATCH /v1/lanes/{lane}/keys/{key}):
// its limits (the lane's per_key defaults, or its override) and its state on
// the answering instance.
type KeyStatus struct {
	Lane        string  `json:"lane"`
	Key         string  `json:"key"`
	Rate        float64 `json:"rate"`
	Burst       int     `json:"burst"`
	MaxInflight int     `json:"max_inflight"`
	Weight      float64 `json:"weight"`
	// EffectiveRate is Rate slowed down by per_key.adaptive after the
	// key's downstream pushed back (Rate when it did not, or recovered).
	EffectiveRate float64 `json:"effective_rate"`
	// Paused: an operator paused the key (PATCH); PausedUntil: a
	// downstream asked it to wait until then (RFC 3339), on this instance.
	Paused      bool   `json:"paused"`
	PausedUntil string `json:"paused_until,omitempty"`
	// Overridden: the key has an override of its own.
	Overridden bool `json:"overridden"`
	// Active: the answering instance reads the key's jobs now; InFlight
	// counts them there.
	Active   bool `json:"active"`
	InFlight int  `json:"in_flight"`
	// URL is where the key's jobs go (its override); Headers names the
	// headers sent with them (values are not shown); SigningSecretSet
	// says the key signs with its own secret (never shown).
	URL              string   `json:"url,omitempty"`
	Headers          []string `json:"headers,omitempty"`
	SigningSecretSet bool     `json:"signing_secret_set,omitempty"`
}

// Whoami is the body of GET /v1/whoami: who the caller's key is and what
// it may do. Without API keys every caller is anonymous and may do
// everything.
type Whoami struct {
	Anonymous bool   `json:"anonymous"`
	Key       string `json:"key,omitempty"`
	Admin     bool   `json:"admin"`
	Read      bool   `json:"read"`
	Submit    bool   `json:"submit"`
	// SubmitLanes are the lanes a key with submit:<lane> scopes may submit to.
	SubmitLanes []string `json:"submit_lanes,omitempty"`
}

// Quota is a target's documented limit: at most Limit starts in any window
// of Per.
type Quota struct {
	Limit int64 `json:"limit"`
	// Per is the window, as a Go duration ("1h0m0s").
	Per   string `json:"per"`
	Burst int    `json:"burst"`
}

// Lanes is the body of GET /v1/lanes.
type Lanes struct {
	Lanes []LaneStatus `json:"lanes"`
	// Plans, with caller quotas on, are the caller plans and their
	// utilization.
	Plans []PlanStatus `json:"plans,omitempty"`
}

// DeadLetter is one stored dead letter.
type DeadLetter struct {
	Seq         uint64    `json:"seq"`
	ID          string    `json:"id"`
	Lane        string    `json:"lane"`
	Key         string    `json:"key,omitempty"`
	Reason      string    `json:"reason"`
	Attempts    int       `json:"attempts"`
	LastStatus  int       `json:"last_status,omitempty"`
	LastError   string    `json:"last_error,omitempty"`
	DeadAt      time.Time `json:"dead_at"`
	ContentType string    `json:"content_type,omitempty"`
	Size        int       `json:"size"`
	// Method, Path and URL are what the job asked for (Throttle-Method,
	// Throttle-Path, Throttle-URL); Headers names the headers it forwards
	// (Throttle-Forward-<Name>). Their values are never shown.
	Method  string   `json:"method,omitempty"`
	Path    string   `json:"path,omitempty"`
	URL     string   `json:"url,omitempty"`
	Headers []string `json:"headers,omitempty"`
	// Expires is the expiry the job named (Throttle-Expires), kept for a
	// replay: once it has passed, the dead letter is not replayed.
	Expires *time.Time `json:"expires,omitempty"`
	// Payload is the job's body (base64 in JSON); only GET of one dead
	// letter carries it.
	Payload []byte `json:"payload,omitempty"`
}

// DeadLetters is one page of GET /v1/lanes/{lane}/dead.
type DeadLetters struct {
	Dead []DeadLetter `json:"dead"`
	// NextAfter, when set, is the after= of the next page.
	NextAfter uint64 `json:"next_after,omitempty"`
}

// Problem is an RFC 9457 problem details body. Field names the request part
// that was wrong (a path parameter, a header, the body), Lane the lane.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	Field    string `json:"field,omitempty"`
	Lane     string `json:"lane,omitempty"`
	// RetryAfterSeconds mirrors the Retry-After header for clients that only
	// read bodies.
	RetryAfterSeconds int64 `json:"retry_after_seconds,omitempty"`
}
