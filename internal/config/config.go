// Package config loads and validates the throttler's one YAML file. Every
// error names the file and the field (lanes[0].rate), and a config that fails
// validation is never half-applied: Load returns either a whole valid Config or
// an error.
package config

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/leaky"
	"go.yaml.in/yaml/v3"
)

// Config is the whole service configuration. The zero value is not valid; start
// from Default and override.
type Config struct {
	// Listen is the HTTP API address (API, /metrics, /healthz, /readyz).
	Listen string `yaml:"listen"`
	// ShutdownTimeout bounds a graceful stop: intake stops at once, in-flight
	// dispatches get this long to finish.
	ShutdownTimeout Duration    `yaml:"shutdown_timeout"`
	NATS            NATS        `yaml:"nats"`
	Redis           Redis       `yaml:"redis"`
	Dispatch        Dispatch    `yaml:"dispatch"`
	DeadLetters     DeadLetters `yaml:"dead_letters"`
	Retries         Retries     `yaml:"retries"`
	Log             Log         `yaml:"log"`
	Lanes           []Lane      `yaml:"lanes"`
	// Auth says who may call the HTTP API; see auth.go.
	Auth Auth `yaml:"auth"`
	// TLS serves the HTTP API over HTTPS, with client certificates if set.
	TLS TLS `yaml:"tls"`
	// HTTP bounds the HTTP server: timeouts, connections, bodies.
	HTTP HTTP `yaml:"http"`
	// Callers are the caller quotas (per client IP, per API key's plan);
	// nil (no callers section) turns them off. See callers.go.
	Callers *Callers `yaml:"callers"`

	// getenv is the environment Parse read, for the _env secrets of a
	// keys_file read later (LoadKeys); nil: none.
	getenv func(string) string
}

// DeadLetters bounds the dead-letter stream shared by all lanes.
type DeadLetters struct {
	// MaxAge drops dead letters older than this.
	MaxAge Duration `yaml:"max_age"`
	// MaxBytes bounds the stream on disk; the oldest go first.
	MaxBytes ByteSize `yaml:"max_bytes"`
}

// Retries bounds the stream where failed jobs wait for their next attempt
// (THROTTLE_RETRY, shared by all lanes). When it is full a failed job waits
// in its lane instead (holding its max_inflight place) until there is room.
type Retries struct {
	MaxMessages int64    `yaml:"max_messages"`
	MaxBytes    ByteSize `yaml:"max_bytes"`
}

// NATS says where the queue lives.
type NATS struct {
	// URL of a NATS server with JetStream; empty runs an embedded server.
	URL string `yaml:"url"`
	// DataDir is the embedded server's JetStream storage.
	DataDir string `yaml:"data_dir"`
	// Listen is the embedded server's client address; empty: in-process only.
	Listen string `yaml:"listen"`
	// DedupWindow is how long a job id is remembered for de-duplication.
	DedupWindow Duration `yaml:"dedup_window"`
	// Replicas of every stream and consumer on a JetStream cluster (1, 3 or
	// 5); the embedded server takes 1.
	Replicas int `yaml:"replicas"`
	// User and Password: the throttler's own NATS user. With the embedded
	// server they create it (required for a non-loopback listen); with
	// nats.url they log in (a user:password in the URL works too).
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// CredsFile (a JWT .creds file) and NkeySeedFile log in to an external
	// server.
	CredsFile    string  `yaml:"creds_file"`
	NkeySeedFile string  `yaml:"nkey_seed_file"`
	TLS          NATSTLS `yaml:"tls"`
	// Publishers are outside publishers of the embedded server: each may
	// publish jobs on the public subjects of its lanes (all lanes when
	// none are listed), and nothing else.
	Publishers []Publisher `yaml:"publishers"`
	// Workers are the worker users of pull-mode lanes. The throttler
	// answers a pull request only on a reply subject inside the inbox of a
	// worker of its lane, _INBOX.<user>.; a lane no worker names answers
	// any _INBOX.<user>. inbox. On the embedded server they are its users
	// (with a password): each may ask for jobs and report outcomes on its
	// lanes' work subjects, and read its own inbox, nothing else. On an
	// external server they are names only (no password): the server's
	// operator gives them the permissions of docs/WORKERS.md.
	Workers []Worker `yaml:"workers"`
	// PullLogin is the login of the connection that talks to pull-mode
	// workers on an external server: a user that may publish to the
	// workers' inboxes only (docs/OPERATIONS.md). Unset, the throttler's
	// own connection answers them (a warning at start). The embedded
	// server creates this user itself (EmbeddedPullUser).
	PullLogin NATSLogin `yaml:"pull_login"`
}

// NATSLogin logs in to an external NATS server: user and password, or a
// JWT .creds file, or an nkey seed file.
type NATSLogin struct {
	User         string `yaml:"user"`
	Password     string `yaml:"password"`
	CredsFile    string `yaml:"creds_file"`
	NkeySeedFile string `yaml:"nkey_seed_file"`
}

// Set reports whether any login is given.
func (l NATSLogin) Set() bool { return l != NATSLogin{} }

// EmbeddedPullUser is the user the embedded server creates for the
// connection that talks to pull-mode workers: it may publish to the
// workers' inboxes and read the lanes' work and outcome subjects, nothing
// else. No other user may take the name.
const EmbeddedPullUser = "throttler-pull"

// WorkersOf returns the worker users of lane (those that list it, or list
// no lane), in config order; none when no worker names it.
func (n NATS) WorkersOf(lane string) []string {
	var out []string
	for _, w := range n.Workers {
		if w.Serves(lane) {
			out = append(out, w.User)
		}
	}
	return out
}

// Serves reports whether the worker serves lane: it lists it, or lists
// no lane (every pull-mode lane).
func (w Worker) Serves(lane string) bool { return len(w.Lanes) == 0 || slices.Contains(w.Lanes, lane) }

// NATSTLS configures TLS to an external NATS server.
type NATSTLS struct {
	// CAFile verifies the server; CertFile and KeyFile are a client
	// certificate (mutual TLS).
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Publisher is an outside publisher of the embedded NATS server.
type Publisher struct {
	User     string   `yaml:"user"`
	Password string   `yaml:"password"`
	Lanes    []string `yaml:"lanes"`
}

// Worker is a pull-mode worker user: of the embedded NATS server (with a
// password), or of an external one (a name only).
type Worker struct {
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// Lanes are the pull-mode lanes it serves; none means every one.
	Lanes []string `yaml:"lanes"`
}

// Redis says where the shared lane state lives.
type Redis struct {
	// URL of Redis (redis://host:port/db); empty uses the in-memory pacer,
	// which is only correct for a single instance. For mode cluster, more
	// nodes go in addr= query parameters; for mode sentinel, the URL names a
	// sentinel, master_name= the master, addr= more sentinels.
	URL string `yaml:"url"`
	// Mode is single (default), cluster (Redis Cluster; a lane's keys share
	// one slot through the {lane} hash tag) or sentinel (failover).
	Mode string `yaml:"mode"`
}

// Dispatch holds settings shared by every target.
type Dispatch struct {
	// AllowNetworks lists networks that targets may resolve to although they
	// are loopback or private (the SSRF guard refuses those by default).
	AllowNetworks []string `yaml:"allow_networks"`
}

// Log configures the JSON logger.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
}

// Lane is one named destination with its limits.
type Lane struct {
	Name string `yaml:"name"`
	// Rate is how fast the lane starts jobs, written like a quota: "20/s",
	// "120/min", "1000/h", or a bare number of jobs per second (0.5).
	// With Quota it is derived (ApplyDefaults).
	Rate bucket.Rate `yaml:"rate"`
	// Burst is how many jobs an idle lane admits at once. With Quota it is
	// the quota's burst.
	Burst int `yaml:"burst"`
	// Quota, given instead of Rate and Burst, is the target's documented
	// limit; Rate and Burst are derived from it so that no window of its
	// length ever holds more than its limit of starts (bucket.Quota.Rate).
	// It stays here as written, for display.
	Quota *Quota `yaml:"quota"`
	// MaxInflight is how many dispatches of the lane may run at once.
	MaxInflight int `yaml:"max_inflight"`
	// MaxBacklog is how many jobs may wait; over it submissions get 429.
	MaxBacklog int64 `yaml:"max_backlog"`
	// MaxWait refuses (429) jobs whose estimated wait is longer; 0: no bound.
	MaxWait Duration `yaml:"max_wait"`
	// MaxAge dead-letters (reason "expired") a job not started this long
	// after it entered the lane (for a delayed job: after it was due); 0:
	// jobs wait as long as it takes.
	MaxAge Duration `yaml:"max_age"`
	// MaxDelay bounds the delay a job may ask for (Throttle-Delay,
	// Throttle-Not-Before); zero means queue.DefaultMaxDelay (30 days).
	MaxDelay Duration `yaml:"max_delay"`
	// MaxBytes bounds the lane's stream on disk; a full stream answers 503.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// MaxBody is the largest accepted payload in bytes.
	MaxBody ByteSize `yaml:"max_body"`
	// AdmitWait bounds how long a submission whose lane has room waits to
	// hear the slot the drain gives its job: "admitted" when the slot is due
	// at once, else "queued" with that slot as its ETA. Zero means
	// DefaultAdmitWait.
	AdmitWait Duration `yaml:"admit_wait"`
	// AckWait is how long the jobs a crashed instance held stay invisible to
	// the others; live instances keep their jobs alive with in-progress acks.
	// Zero means DefaultAckWait (ApplyDefaults).
	AckWait Duration `yaml:"ack_wait"`
	// PerKey makes the lane keyed: every key (the Throttle-Key header, or
	// the subject throttle.<lane>.<key>) gets its own bucket with these
	// defaults, under the lane's own rate, burst and max_inflight as a
	// lane-wide cap. nil: the lane is not keyed.
	PerKey   *PerKey  `yaml:"per_key"`
	Retry    Retry    `yaml:"retry"`
	Adaptive Adaptive `yaml:"adaptive"`
	Target   Target   `yaml:"target"`
	// Cost is what one job of the lane costs a caller's plan, in tokens
	// (caller quotas); zero means 1.
	Cost int `yaml:"cost"`
	// Observe computes, logs and counts the caller quota refusals of the
	// lane's submissions without enforcing them.
	Observe bool `yaml:"observe"`
	// Results keeps a record of each job (results.go); nil keeps none.
	Results *Results `yaml:"results"`
}

// PerKey is every key's default limit on a keyed lane.
type PerKey struct {
	// Rate and Burst are each key's bucket.
	Rate  bucket.Rate `yaml:"rate"`
	Burst int         `yaml:"burst"`
	// MaxInflight bounds each key's jobs in flight; 0 means the lane's
	// max_inflight.
	MaxInflight int `yaml:"max_inflight"`
	// Ordered: a key's next job starts only after the previous one is
	// settled (delivered, or dead); a failing job holds its key, not the
	// lane. It implies max_inflight 1.
	Ordered bool `yaml:"ordered"`
	// Adaptive slows a key down on its own when its target pushes back
	// (429, 5xx, an exhausted rate-limit header), and recovers slowly,
	// never above the key's rate; other keys and the lane keep theirs.
	Adaptive Adaptive `yaml:"adaptive"`
	// KeyFrom says where a job without a key gets one: "" (nowhere: every
	// job names its key) or "url_host" (dest.KeyFromURLHost): a job that
	// names a URL (Throttle-URL, a batch item's url) gets the URL's host
	// as its key, a bucket per receiving host. Only on a lane whose
	// target.http lists job_urls.
	KeyFrom string `yaml:"key_from"`
}

// Quota is a target's documented limit: at most Limit requests in any window
// of length Per, of which up to Burst may come at once.
type Quota struct {
	Limit int64    `yaml:"limit"`
	Per   Duration `yaml:"per"`
	// Burst is optional: 0 means 1 (ApplyDefaults).
	Burst int `yaml:"burst"`
}

// rate derives the lane's rate from q (see bucket.Quota.Rate), with the
// drain's lateness bound.
func (q Quota) rate() (bucket.Rate, error) {
	return bucket.Quota{Limit: q.Limit, Per: q.Per.D(), Burst: q.Burst}.Rate(leaky.DefaultMaxLate)
}

// Adaptive turns on AIMD: the lane slows down when its target answers 429
// and recovers slowly, never above rate.
type Adaptive struct {
	Enabled bool `yaml:"enabled"`
	// Decrease multiplies the rate on a rate-limit answer (0.5 halves it).
	Decrease float64 `yaml:"decrease"`
	// Increase is the share of rate added back every Interval without one.
	Increase float64 `yaml:"increase"`
	// Min is the lowest share of rate the lane slows down to.
	Min      float64  `yaml:"min"`
	Interval Duration `yaml:"interval"`
}

// Retry is a lane's retry policy: exponential backoff with full jitter.
type Retry struct {
	// MaxAttempts is how many delivery attempts a job gets before it is
	// dead-lettered. Rate-limit waits do not count.
	MaxAttempts int      `yaml:"max_attempts"`
	BackoffBase Duration `yaml:"backoff_base"`
	BackoffMax  Duration `yaml:"backoff_max"`
}

// Target says where a lane's jobs go. Exactly one kind is set.
type Target struct {
	HTTP *HTTPTarget `yaml:"http"`
	NATS *NATSTarget `yaml:"nats"`
	// Handler names an in-process Go handler registered with
	// service.Service.Handle. Only a program inside this module can
	// register one (tests, benchmarks), so a file cannot set it: a Go
	// program of another module serves a lane with the public worker
	// package (a pull-mode NATS target) instead.
	Handler string `yaml:"-"`
}

// NATSTarget delivers a job to a worker pool over NATS.
type NATSTarget struct {
	Subject string   `yaml:"subject"`
	Timeout Duration `yaml:"timeout"`
	// JetStream publishes to a stream (its ack means done) instead of
	// request/reply.
	JetStream bool `yaml:"jetstream"`
	// Mode is how jobs reach the workers: NATSModeRequest (the default:
	// a request to the subject's queue group per job) or NATSModePull
	// (each worker asks for its next job when it is free; docs/WORKERS.md).
	Mode string `yaml:"mode"`
	// Lease bounds how long a pull-mode worker holds a job without
	// reporting; 0 means dispatch.DefaultLease. Pull mode only.
	Lease Duration `yaml:"lease"`
}

// Modes of a NATS target.
const (
	NATSModeRequest = "request"
	NATSModePull    = "pull"
)

// Pull reports whether the target is a pull-mode NATS target.
func (t Target) Pull() bool { return t.NATS != nil && t.NATS.Mode == NATSModePull }

// HTTPTarget delivers a job as an HTTP request.
type HTTPTarget struct {
	URL     string            `yaml:"url"`
	Method  string            `yaml:"method"`
	Headers map[string]string `yaml:"headers"`
	Timeout Duration          `yaml:"timeout"`
	// RetryOther4xx retries 4xx answers other than 408/425/429 instead of
	// dead-lettering them.
	RetryOther4xx bool `yaml:"retry_other_4xx"`
	// Methods are the methods a job may ask for (Throttle-Method);
	// Method is always allowed and is the default.
	Methods []string `yaml:"methods"`
	// ForwardHeaders are the headers a job may send to the target
	// (Throttle-Forward-<Name>); dest.CheckForwardName says which never.
	ForwardHeaders []string `yaml:"forward_headers"`
	// JobURLs are the prefixes a job's whole URL (Throttle-URL) must be
	// under; empty: jobs cannot name a URL.
	JobURLs []string `yaml:"job_urls"`
	// SigningSecrets turn on Standard Webhooks signatures; several secrets
	// sign with each (rotation). Form: whsec_ followed by the standard
	// base64 of 24 to 64 random bytes (dispatch.ParseSigningSecret).
	SigningSecrets []string `yaml:"signing_secrets"`
}

// DestConfig is the target's lists as package dest takes them.
func (h HTTPTarget) DestConfig() dest.Config {
	return dest.Config{URL: h.URL, Method: h.Method, Methods: h.Methods, ForwardHeaders: h.ForwardHeaders, JobURLs: h.JobURLs}
}

// Duration is a time.Duration written as "10s" or "1m30s" in YAML.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		return badValue(n, "%q is not a duration like 10s or 1m30s", n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// ByteSize is a size in bytes written as 1048576, "512KiB" or "1MiB" in YAML.
type ByteSize int64

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	s := strings.TrimSpace(n.Value)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseUint(s, 10, 63)
	switch {
	case n.Kind != yaml.ScalarNode || errors.Is(err, strconv.ErrSyntax):
		return badValue(n, "%q is not a size like 1048576, 512KiB or 1MiB", n.Value)
	case err != nil || v > math.MaxInt64/uint64(mult):
		return badValue(n, "%q is too large: a size is at most 8EiB (2^63-1 bytes)", n.Value)
	}
	*b = ByteSize(int64(v) * mult)
	return nil
}
