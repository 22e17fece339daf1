// Package config loads and validates the throttler's one YAML file. Every
// error names the file and the field (lanes[0].rate), and a config that fails
// validation is never half-applied: Load returns either a whole valid Config or
// an error.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dispatch"
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
	// Workers are outside workers of the embedded server's pull-mode
	// lanes: each may ask for jobs and report outcomes on its lanes' work
	// subjects, and read its own inbox (_INBOX.<user>.>), nothing else.
	Workers []Worker `yaml:"workers"`
}

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

// Worker is a pull-mode worker user of the embedded NATS server.
type Worker struct {
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// Lanes are the pull-mode lanes it serves; none means every one.
	Lanes []string `yaml:"lanes"`
}

// workerUser is what a worker's user name may be: it is also a token of
// its inbox prefix, _INBOX.<user>.
var workerUser = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

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

// applyDefaults fills an enabled block's unset fields.
func (a *Adaptive) applyDefaults() {
	if !a.Enabled {
		return
	}
	if a.Decrease == 0 {
		a.Decrease = 0.5
	}
	if a.Increase == 0 {
		a.Increase = 0.05
	}
	if a.Min == 0 {
		a.Min = 0.1
	}
	if a.Interval == 0 {
		a.Interval = Duration(5 * time.Second)
	}
}

// check names the first bad field of an enabled block and what is wrong
// with it ("" when none).
func (a Adaptive) check() (field, msg string) {
	if !a.Enabled {
		return "", ""
	}
	switch {
	case !(a.Decrease > 0 && a.Decrease < 1):
		return "decrease", fmt.Sprintf("must be between 0 and 1 (exclusive), got %v", a.Decrease)
	case !(a.Increase > 0 && a.Increase <= 1):
		return "increase", fmt.Sprintf("must be in (0, 1], got %v", a.Increase)
	case !(a.Min > 0 && a.Min <= 1):
		return "min", fmt.Sprintf("must be in (0, 1], got %v", a.Min)
	case a.Interval <= 0:
		return "interval", "must be greater than 0"
	}
	return "", ""
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
	// SigningSecrets turn on Standard Webhooks signatures; several secrets
	// sign with each (rotation). Form: whsec_ followed by the standard
	// base64 of 24 to 64 random bytes (dispatch.ParseSigningSecret).
	SigningSecrets []string `yaml:"signing_secrets"`
}

// Default returns the settings used for everything a file leaves out.
func Default() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		ShutdownTimeout: Duration(15 * time.Second),
		NATS:            NATS{DataDir: "./data", DedupWindow: Duration(2 * time.Minute), Replicas: 1},
		DeadLetters:     DeadLetters{MaxAge: Duration(14 * 24 * time.Hour), MaxBytes: 1 << 30},
		Retries:         Retries{MaxMessages: 1_000_000, MaxBytes: 1 << 30},
		Log:             Log{Level: "info"},
		HTTP:            DefaultHTTP(),
	}
}

// Lane defaults, applied to each lane that leaves a field out.
const (
	DefaultMaxInflight = 16
	DefaultMaxBacklog  = 100_000
	DefaultMaxBody     = 1 << 20
	DefaultTimeout     = 10 * time.Second
	DefaultMaxBytes    = 1 << 30
	DefaultMaxAttempts = 10
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
	// DefaultAdmitWait: the drain usually gives a job of an idle lane its
	// slot within a millisecond; this bounds a loaded machine's wait.
	DefaultAdmitWait = 100 * time.Millisecond
	// DefaultAckWait bounds how long the jobs a crashed instance held stay
	// invisible to the others; live instances keep their jobs alive.
	DefaultAckWait = 5 * time.Second
)

// Load reads path, resolves the _env and _file forms of secret fields
// (secrets.go; variables through getenv), applies env overrides through
// getenv (THROTTLER_LISTEN, THROTTLER_NATS_URL, THROTTLER_NATS_DATA_DIR,
// THROTTLER_NATS_LISTEN, THROTTLER_REDIS_URL, THROTTLER_LOG_LEVEL), fills
// defaults, validates, and reads auth.keys_file to check it.
func Load(path string, getenv func(string) string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(path, raw, getenv)
}

// Parse is Load on bytes already read; path only names the source in errors.
func Parse(path string, raw []byte, getenv func(string) string) (Config, error) {
	cfg := Default()
	if err := oneDocument(raw); err != nil {
		return Config{}, inFile(err, path)
	}
	if err := decodeStrict(raw, &cfg, configSecret, getenv); err != nil {
		return Config{}, inFile(err, path)
	}
	cfg.getenv = getenv
	if getenv != nil {
		for env, dst := range map[string]*string{
			"THROTTLER_LISTEN":        &cfg.Listen,
			"THROTTLER_NATS_URL":      &cfg.NATS.URL,
			"THROTTLER_NATS_DATA_DIR": &cfg.NATS.DataDir,
			"THROTTLER_NATS_LISTEN":   &cfg.NATS.Listen,
			"THROTTLER_REDIS_URL":     &cfg.Redis.URL,
			"THROTTLER_LOG_LEVEL":     &cfg.Log.Level,
		} {
			if v, ok := lookup(getenv, env); ok {
				*dst = v
			}
		}
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.File = path
		}
		return Config{}, err
	}
	// The keys file is read again by the service (and on SIGHUP); reading
	// it here refuses a bad one before anything starts.
	if _, err := cfg.LoadKeys(); err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.File == "" {
			ce.File = path
		}
		return Config{}, err
	}
	return cfg, nil
}

func secondDocument(line int) string {
	msg := "a second YAML document (after ---)"
	if line > 0 {
		msg = fmt.Sprintf("line %d: %s", line, msg)
	}
	return msg + " is not allowed: the file holds exactly one config"
}

// valueError is the error of a value type's UnmarshalYAML (Duration,
// ByteSize): the decoder returns it as is, and Parse finds the field at its
// position to name it.
type valueError struct {
	line, column int
	msg          string
}

func (e *valueError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

func badValue(n *yaml.Node, format string, args ...any) error {
	return &valueError{line: n.Line, column: n.Column, msg: fmt.Sprintf(format, args...)}
}

// findField returns the path (lanes[0].max_bytes) and node of the first
// scalar value of raw's first document, in document order, that match
// accepts, or "" and nil.
func findField(raw []byte, match func(path string, n *yaml.Node) bool) (string, *yaml.Node) {
	var doc yaml.Node
	if yaml.Unmarshal(raw, &doc) != nil || len(doc.Content) == 0 {
		return "", nil
	}
	var walk func(n *yaml.Node, path string) (string, *yaml.Node)
	walk = func(n *yaml.Node, path string) (string, *yaml.Node) {
		switch n.Kind {
		case yaml.ScalarNode:
			if path != "" && match(path, n) {
				return path, n
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				key := n.Content[i].Value
				if path != "" {
					key = path + "." + key
				}
				if p, m := walk(n.Content[i+1], key); m != nil {
					return p, m
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if p, m := walk(c, fmt.Sprintf("%s[%d]", path, i)); m != nil {
					return p, m
				}
			}
		}
		return "", nil
	}
	return walk(doc.Content[0], "")
}

// sections names the Go types of the config in the words of the file.
var sections = strings.NewReplacer(
	"in type config.Config", "at the top level",
	"in type config.NATS", "in nats",
	"in type config.Redis", "in redis",
	"in type config.Dispatch", "in dispatch",
	"in type config.Log", "in log",
	"in type config.Lane", "in a lane",
	"in type config.Quota", "in a lane's quota",
	"into bucket.Rate", "into a rate",
	"in type config.Target", "in a lane's target",
	"in type config.HTTPTarget", "in target.http",
	"in type config.NATSTarget", "in target.nats",
	"in type config.Retry", "in a lane's retry",
	"in type config.Adaptive", "in a lane's adaptive",
	"in type config.DeadLetters", "in dead_letters",
	"in type config.Auth", "in auth",
	"in type config.Key", "in a key",
	"in type config.TLS", "in tls",
	"in type config.HTTP", "in http",
	"in type config.Callers", "in callers",
	"in type config.PerIP", "in callers.per_ip",
	"in type config.Plan", "in a plan",
)

// yamlMessage turns a decoder error into one line per problem, each with its
// line number, in the file's own vocabulary.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return sections.Replace(strings.Join(te.Errors, "; "))
	}
	return sections.Replace(strings.TrimPrefix(err.Error(), "yaml: "))
}

func lookup(getenv func(string) string, key string) (string, bool) {
	v := getenv(key)
	return v, v != ""
}

// ApplyDefaults fills every lane field left at zero with its default; Load
// does it, code that builds a Config by hand calls it before Validate.
func (c *Config) ApplyDefaults() {
	for i := range c.Lanes {
		c.Lanes[i].applyDefaults()
	}
	if c.Callers != nil {
		c.Callers.applyDefaults()
	}
}

func (l *Lane) applyDefaults() {
	if l.MaxInflight == 0 {
		l.MaxInflight = DefaultMaxInflight
	}
	if l.MaxBacklog == 0 {
		l.MaxBacklog = DefaultMaxBacklog
	}
	if l.MaxBody == 0 {
		l.MaxBody = DefaultMaxBody
	}
	if q := l.Quota; q != nil {
		if q.Burst == 0 {
			q.Burst = 1
		}
		// Derived only when rate and burst are left out; Validate refuses
		// a lane that gives both.
		if r, err := q.rate(); err == nil && l.Rate.IsZero() && l.Burst == 0 {
			l.Rate, l.Burst = r, q.Burst
		}
	}
	if l.Burst == 0 {
		l.Burst = 1
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.AckWait == 0 {
		l.AckWait = Duration(DefaultAckWait)
	}
	if k := l.PerKey; k != nil {
		if k.Burst == 0 {
			k.Burst = 1
		}
		if k.MaxInflight == 0 {
			k.MaxInflight = l.MaxInflight
		}
		if k.Ordered {
			k.MaxInflight = 1
		}
	}
	if l.AdmitWait == 0 {
		l.AdmitWait = Duration(DefaultAdmitWait)
	}
	if l.Cost == 0 {
		l.Cost = 1
	}
	if l.Retry.MaxAttempts == 0 {
		l.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if l.Retry.BackoffBase == 0 {
		l.Retry.BackoffBase = Duration(DefaultBackoffBase)
	}
	if l.Retry.BackoffMax == 0 {
		l.Retry.BackoffMax = Duration(DefaultBackoffMax)
	}
	l.Adaptive.applyDefaults()
	if k := l.PerKey; k != nil {
		k.Adaptive.applyDefaults()
	}
	if n := l.Target.NATS; n != nil {
		if n.Timeout == 0 {
			n.Timeout = Duration(DefaultTimeout)
		}
		if n.Mode == "" {
			n.Mode = NATSModeRequest
		}
		if n.Mode == NATSModePull && n.Lease == 0 {
			n.Lease = Duration(dispatch.DefaultLease)
		}
	}
	if h := l.Target.HTTP; h != nil {
		if h.Method == "" {
			h.Method = "POST"
		}
		if h.Timeout == 0 {
			h.Timeout = Duration(DefaultTimeout)
		}
	}
}

// Error is a configuration error that names the file and the field.
type Error struct {
	File  string
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

var laneName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// laneRate matches the path of a lane's or a plan's rate.
var laneRate = regexp.MustCompile(`^(lanes\[[0-9]+\]|callers\.plans\.[^.]+)\.rate$`)

// MaxCost bounds a lane's per-job cost.
const MaxCost = 1000

// reservedLaneName reports whether a lane may not be called name because its
// stream, THROTTLE_<name>, would be one of the streams every lane shares
// (queue.DeadStream, queue.RetryStream). Case is ignored: stream names that
// differ only in case would share a directory on a case-insensitive file
// system.
func reservedLaneName(name string) (stream string, reserved bool) {
	switch u := strings.ToUpper(name); u {
	case "DEAD", "RETRY":
		return "THROTTLE_" + u, true
	}
	return "", false
}

// ownSubjects are the subject spaces of the throttler itself and of the NATS
// server (first token → the pattern reported): a lane's target may not
// publish into them, where a job would come back as a submission, a control
// message, a retry, a dead letter or a server API call.
var ownSubjects = map[string]string{
	"throttle":       "throttle.>",       // lane intake: throttle.<lane> (queue.SubjectPrefix)
	"throttler":      "throttler.>",      // control messages between instances
	"throttle_retry": "throttle_retry.>", // queue.RetrySubjectPrefix
	"throttle_dead":  "throttle_dead.>",  // queue.DeadSubjectPrefix
	"$JS":            "$JS.>",
	"$KV":            "$KV.>",
	"$SYS":           "$SYS.>",
	"_INBOX":         "_INBOX.>",
}

// ownSubject returns the reserved pattern that subject falls in, if any.
func ownSubject(subject string) (pattern string, own bool) {
	if subject == "throttle" {
		return "throttle", true
	}
	first, rest, more := strings.Cut(subject, ".")
	if pattern, own = ownSubjects[first]; own && more && rest != "" {
		return pattern, true
	}
	return "", false
}

// checkListen checks a listen address and returns what is wrong with it, or
// "". The host is an IP address or localhost; it may be left out (":8080",
// every interface) unless needHost. The port is a number from 0 to 65535; 0
// (a free port) only when !needHost, since the embedded NATS server reads 0
// as its default port.
func checkListen(addr string, needHost bool) string {
	form := "127.0.0.1:8080, [::1]:8080, localhost:8080 or :8080"
	if needHost {
		form = "127.0.0.1:4222, [::1]:4222 or localhost:4222"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("%q is not host:port (like %s)", addr, form)
	}
	switch {
	case host == "" && needHost:
		return fmt.Sprintf("%q has no host: give an IP address or localhost (like %s)", addr, form)
	case host == "" || host == "localhost":
	default:
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Sprintf("host %q of %q is not an IP address or localhost", host, addr)
		}
	}
	n, err := strconv.ParseUint(port, 10, 16)
	switch {
	case port == "" || errors.Is(err, strconv.ErrSyntax):
		return fmt.Sprintf("port %q of %q is not a number (like %s)", port, addr, form)
	case err != nil:
		return fmt.Sprintf("port %s of %q is out of range (0 to 65535)", port, addr)
	case n == 0 && needHost:
		return fmt.Sprintf("port 0 of %q: give the port to listen on (1 to 65535)", addr)
	}
	return ""
}

// Validate checks every field and returns the first error, naming the field.
func (c *Config) Validate() error {
	fail := func(field, format string, args ...any) error {
		return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if msg := checkListen(c.Listen, false); msg != "" {
		return fail("listen", "%s", msg)
	}
	if c.ShutdownTimeout <= 0 {
		return fail("shutdown_timeout", "must be greater than 0")
	}
	if c.NATS.URL == "" && c.NATS.DataDir == "" {
		return fail("nats.data_dir", "must be set when nats.url is empty (embedded server)")
	}
	if c.NATS.Listen != "" {
		if msg := checkListen(c.NATS.Listen, true); msg != "" {
			return fail("nats.listen", "%s", msg)
		}
	}
	if c.NATS.DedupWindow <= 0 {
		return fail("nats.dedup_window", "must be greater than 0")
	}
	switch c.NATS.Replicas {
	case 1, 3, 5:
	default:
		return fail("nats.replicas", "must be 1, 3 or 5, got %d", c.NATS.Replicas)
	}
	if err := c.NATS.validateAuth(c.Lanes); err != nil {
		return err
	}
	if c.NATS.URL == "" && c.NATS.Replicas != 1 {
		return fail("nats.replicas", "the embedded server is a single node: replicas must be 1")
	}
	switch c.Redis.Mode {
	case "", "single", "cluster", "sentinel":
	default:
		return fail("redis.mode", "%q is not one of single, cluster, sentinel", c.Redis.Mode)
	}
	if c.Redis.Mode == "sentinel" && c.Redis.URL != "" && !strings.Contains(c.Redis.URL, "master_name=") {
		return fail("redis.url", "mode sentinel needs master_name= in the URL")
	}
	if c.Redis.URL != "" {
		if u, err := url.Parse(c.Redis.URL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			return fail("redis.url", "%q is not a redis:// or rediss:// URL", RedactURL(c.Redis.URL))
		}
	}
	if c.DeadLetters.MaxAge < 0 {
		return fail("dead_letters.max_age", "must not be negative")
	}
	if c.DeadLetters.MaxBytes < 1<<20 {
		return fail("dead_letters.max_bytes", "must be at least 1MiB")
	}
	if c.Retries.MaxMessages < 1 {
		return fail("retries.max_messages", "must be at least 1, got %d", c.Retries.MaxMessages)
	}
	if c.Retries.MaxBytes < 1<<20 {
		return fail("retries.max_bytes", "must be at least 1MiB")
	}
	for i, n := range c.Dispatch.AllowNetworks {
		if _, err := netip.ParsePrefix(n); err != nil {
			return fail(fmt.Sprintf("dispatch.allow_networks[%d]", i), "%q is not a CIDR prefix", n)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fail("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	if len(c.Lanes) == 0 {
		return fail("lanes", "at least one lane is required")
	}
	seen := map[string]int{}
	for i, l := range c.Lanes {
		p := fmt.Sprintf("lanes[%d]", i)
		if !laneName.MatchString(l.Name) {
			return fail(p+".name", "%q must be 1-64 letters, digits, '_' or '-'", l.Name)
		}
		if stream, ok := reservedLaneName(l.Name); ok {
			return fail(p+".name", "%q is reserved: its stream would be %s, which the throttler keeps for all lanes", l.Name, stream)
		}
		if j, dup := seen[l.Name]; dup {
			return fail(p+".name", "%q is already the name of lanes[%d]", l.Name, j)
		}
		seen[l.Name] = i
		if err := l.validate(p); err != nil {
			return err
		}
	}
	if err := c.validateWorkSubjects(); err != nil {
		return err
	}
	if c.Callers != nil {
		if err := c.Callers.validate(); err != nil {
			return err
		}
	}
	return c.validateAccess()
}

// validateWorkSubjects refuses a NATS subject shared by a pull-mode lane
// and any other lane: the pull requests of one lane's workers would be
// answered with the other lane's jobs, or a request-mode lane's jobs would
// reach the instances as pull requests.
func (c *Config) validateWorkSubjects() error {
	pullAt := map[string]int{}
	for i, l := range c.Lanes {
		if l.Target.Pull() {
			pullAt[l.Target.NATS.Subject] = i
		}
	}
	for i, l := range c.Lanes {
		n := l.Target.NATS
		if n == nil {
			continue
		}
		if j, ok := pullAt[n.Subject]; ok && j != i {
			return &Error{Field: fmt.Sprintf("lanes[%d].target.nats.subject", max(i, j)),
				Msg: fmt.Sprintf("%q is the pull-mode work subject of lanes[%d]: a pull-mode lane needs a subject of its own", n.Subject, min(i, j))}
		}
	}
	return nil
}

// validate checks one lane's fields; field names start with prefix.
func (l *Lane) validate(p string) error {
	fail := func(field, format string, args ...any) error {
		return &Error{Field: p + "." + field, Msg: fmt.Sprintf(format, args...)}
	}
	var le *bucket.LimitError
	if q := l.Quota; q != nil {
		r, err := q.rate()
		if errors.As(err, &le) {
			return fail("quota."+le.Field, "%s", le.Msg)
		}
		if err != nil {
			return fail("quota", "%v", err)
		}
		if l.Rate != r || l.Burst != q.Burst {
			return fail("quota", "is given with rate or burst: give either quota, or rate and burst")
		}
		if err := (bucket.Limit{Rate: r.PerSecond(), Burst: q.Burst}).Validate(); err != nil {
			return fail("quota", "derives rate %s and burst %d, which cannot be used: %v", r, q.Burst, err)
		}
	}
	if err := (bucket.Limit{Rate: l.Rate.PerSecond(), Burst: l.Burst}).Validate(); errors.As(err, &le) {
		return fail(le.Field, "%s", le.Msg)
	} else if err != nil {
		return fail("rate", "%v", err)
	}
	switch {
	case l.MaxInflight < 1 || l.MaxInflight > 100_000:
		return fail("max_inflight", "must be between 1 and 100000, got %d", l.MaxInflight)
	case l.MaxBacklog < 1:
		return fail("max_backlog", "must be at least 1, got %d", l.MaxBacklog)
	case l.MaxBody < 1 || l.MaxBody > 64<<20:
		return fail("max_body", "must be between 1 byte and 64MiB, got %d", l.MaxBody)
	case l.AckWait <= 0:
		return fail("ack_wait", "must be greater than 0")
	case l.AdmitWait < 0 || l.AdmitWait > Duration(10*time.Second):
		return fail("admit_wait", "must be between 0 and 10s, got %v", l.AdmitWait.D())
	case l.Cost < 1 || l.Cost > MaxCost:
		return fail("cost", "must be between 1 and %d tokens per job, got %d", MaxCost, l.Cost)
	}
	switch {
	case l.MaxWait < 0:
		return fail("max_wait", "must not be negative")
	case l.MaxBytes < 1<<20:
		return fail("max_bytes", "must be at least 1MiB, got %d", l.MaxBytes)
	case l.Retry.MaxAttempts < 1:
		return fail("retry.max_attempts", "must be at least 1, got %d", l.Retry.MaxAttempts)
	case l.Retry.BackoffBase <= 0:
		return fail("retry.backoff_base", "must be greater than 0")
	case l.Retry.BackoffMax < l.Retry.BackoffBase:
		return fail("retry.backoff_max", "must be at least retry.backoff_base")
	}
	if k := l.PerKey; k != nil {
		if k.Rate.IsZero() {
			return fail("per_key.rate", "is required on a keyed lane (per_key), e.g. 5/s")
		}
		if err := (bucket.Limit{Rate: k.Rate.PerSecond(), Burst: k.Burst}).Validate(); errors.As(err, &le) {
			return fail("per_key."+le.Field, "%s", le.Msg)
		} else if err != nil {
			return fail("per_key.rate", "%v", err)
		}
		if k.MaxInflight < 1 || k.MaxInflight > l.MaxInflight {
			return fail("per_key.max_inflight", "must be between 1 and the lane's max_inflight (%d), got %d", l.MaxInflight, k.MaxInflight)
		}
	}
	if field, msg := l.Adaptive.check(); field != "" {
		return fail("adaptive."+field, "%s", msg)
	}
	if k := l.PerKey; k != nil {
		if field, msg := k.Adaptive.check(); field != "" {
			return fail("per_key.adaptive."+field, "%s", msg)
		}
	}
	kinds := 0
	for _, set := range []bool{l.Target.HTTP != nil, l.Target.NATS != nil, l.Target.Handler != ""} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return fail("target", "exactly one target kind is required (http or nats)")
	}
	if l.Target.Handler != "" {
		return nil
	}
	// The checks below are the target's own (package dispatch), so that a
	// file that loads is a file whose targets open.
	if n := l.Target.NATS; n != nil {
		if !dispatch.ValidSubject(n.Subject) {
			return fail("target.nats.subject", "%q is not a literal NATS subject (tokens separated by '.', no spaces or wildcards)", n.Subject)
		}
		if pattern, own := ownSubject(n.Subject); own {
			return fail("target.nats.subject", "%q is in %s, which the throttler or the NATS server uses itself: a job published there would be taken for a submission, a control or server message", n.Subject, pattern)
		}
		if n.Timeout <= 0 {
			return fail("target.nats.timeout", "must be greater than 0")
		}
		switch n.Mode {
		case "", NATSModeRequest:
			if n.Lease != 0 {
				return fail("target.nats.lease", "applies to mode pull only")
			}
		case NATSModePull:
			if n.JetStream {
				return fail("target.nats.mode", "pull cannot be combined with jetstream: true (workers of a stream pull from the stream itself)")
			}
			if n.Lease < 0 {
				return fail("target.nats.lease", "must not be negative")
			}
			if err := (dispatch.PullConfig{Subject: n.Subject, Lease: n.Lease.D()}).Validate(); err != nil {
				return fail("target.nats", "%v", err)
			}
			return nil
		default:
			return fail("target.nats.mode", "%q is not one of request, pull", n.Mode)
		}
		if err := (dispatch.NATSConfig{Subject: n.Subject, Timeout: n.Timeout.D(), JetStream: n.JetStream}).Validate(); err != nil {
			return fail("target.nats", "%v", err)
		}
		return nil
	}
	h := l.Target.HTTP
	u, err := url.Parse(h.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return fail("target.http.url", "%q is not an absolute http(s) URL with a host", h.URL)
	}
	switch h.Method {
	case "POST", "PUT", "PATCH", "GET", "DELETE":
	default:
		return fail("target.http.method", "%q is not one of POST, PUT, PATCH, GET, DELETE", h.Method)
	}
	if h.Timeout <= 0 {
		return fail("target.http.timeout", "must be greater than 0")
	}
	if err := dispatch.CheckStaticHeaders(h.Headers); err != nil {
		return fail("target.http.headers", "%v", err)
	}
	for i, sec := range h.SigningSecrets {
		if _, err := dispatch.ParseSigningSecret(sec); err != nil {
			return fail(fmt.Sprintf("target.http.signing_secrets[%d]", i), "%v", err)
		}
	}
	hc := dispatch.HTTPConfig{URL: h.URL, Method: h.Method, Headers: h.Headers, Timeout: h.Timeout.D(), RetryOther4xx: h.RetryOther4xx}
	if err := hc.Validate(); err != nil {
		return fail("target.http", "%v", err)
	}
	return nil
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

// validateAuth checks the NATS credentials: an embedded server that listens
// beyond loopback must have them, external-only settings need nats.url, and
// publishers name known lanes.
func (n NATS) validateAuth(lanes []Lane) error {
	fail := func(field, format string, args ...any) error {
		return &Error{Field: "nats." + field, Msg: fmt.Sprintf(format, args...)}
	}
	if (n.User == "") != (n.Password == "") {
		return fail("password", "nats.user and nats.password go together")
	}
	embedded := n.URL == ""
	if embedded {
		for field, v := range map[string]string{"creds_file": n.CredsFile, "nkey_seed_file": n.NkeySeedFile,
			"tls.ca_file": n.TLS.CAFile, "tls.cert_file": n.TLS.CertFile, "tls.key_file": n.TLS.KeyFile} {
			if v != "" {
				return fail(field, "is for an external server (nats.url); the embedded server takes nats.user and nats.password")
			}
		}
		if n.Listen != "" && n.User == "" {
			if ap, err := netip.ParseAddrPort(n.Listen); err == nil && !ap.Addr().IsLoopback() {
				return fail("listen", "%s is reachable from other hosts: set nats.user and nats.password (and nats.publishers for outside publishers)", n.Listen)
			}
		}
		if len(n.Publishers) > 0 && n.User == "" {
			return fail("publishers", "need nats.user and nats.password for the throttler's own user")
		}
		if len(n.Workers) > 0 && n.User == "" {
			return fail("workers", "need nats.user and nats.password for the throttler's own user")
		}
	} else if len(n.Publishers) > 0 {
		return fail("publishers", "are users of the embedded server; on an external server give them the permissions in docs/OPERATIONS.md")
	} else if len(n.Workers) > 0 {
		return fail("workers", "are users of the embedded server; on an external server give them the permissions in docs/WORKERS.md")
	}
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		return fail("tls.key_file", "tls.cert_file and tls.key_file go together")
	}
	known := map[string]bool{}
	for _, l := range lanes {
		known[l.Name] = true
	}
	users := map[string]bool{n.User: true}
	for i, p := range n.Publishers {
		f := fmt.Sprintf("publishers[%d]", i)
		switch {
		case p.User == "" || p.Password == "":
			return fail(f, "needs user and password")
		case users[p.User]:
			return fail(f+".user", "%q is already a user", p.User)
		}
		users[p.User] = true
		for j, l := range p.Lanes {
			if !known[l] {
				return fail(fmt.Sprintf("%s.lanes[%d]", f, j), "no lane %q is configured", l)
			}
		}
	}
	pull := map[string]bool{}
	for _, l := range lanes {
		if l.Target.Pull() {
			pull[l.Name] = true
		}
	}
	for i, w := range n.Workers {
		f := fmt.Sprintf("workers[%d]", i)
		switch {
		case w.User == "" || w.Password == "":
			return fail(f, "needs user and password")
		case !workerUser.MatchString(w.User):
			return fail(f+".user", "%q must be 1-64 letters, digits, '_' or '-' (it names the worker's inbox, _INBOX.<user>)", w.User)
		case users[w.User]:
			return fail(f+".user", "%q is already a user", w.User)
		case len(pull) == 0:
			return fail(f, "no lane has target.nats.mode pull")
		}
		users[w.User] = true
		for j, l := range w.Lanes {
			if !pull[l] {
				return fail(fmt.Sprintf("%s.lanes[%d]", f, j), "no pull-mode lane %q is configured", l)
			}
		}
	}
	return nil
}

// oneDocument refuses a file with a second YAML document: it would be
// silently ignored.
func oneDocument(raw []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var first, next yaml.Node
	if err := dec.Decode(&first); err != nil {
		return nil // an empty file, or a syntax error the decode reports
	}
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		line := next.Line
		if err != nil {
			line = 0
		}
		return &Error{Msg: secondDocument(line)}
	}
	return nil
}

// decodeError describes a decoding error in the file's words, naming the
// field where it can: a bad value (duration, size) knows its line and
// column; bucket.Rate reads its own text and does not know where it is, so
// the field is the first rate in the file that does not parse.
func decodeError(raw []byte, err error) error {
	var ve *valueError
	if errors.As(err, &ve) {
		field, _ := findField(raw, func(_ string, n *yaml.Node) bool { return n.Line == ve.line && n.Column == ve.column })
		return &Error{Field: field, Msg: ve.Error()}
	}
	var re *bucket.RateError
	if errors.As(err, &re) {
		field, n := findField(raw, func(path string, n *yaml.Node) bool {
			_, err := bucket.ParseRate(n.Value)
			return laneRate.MatchString(path) && err != nil
		})
		if n != nil {
			return &Error{Field: field, Msg: fmt.Sprintf("line %d: %v", n.Line, err)}
		}
		return &Error{Msg: err.Error()}
	}
	return &Error{Msg: yamlMessage(err)}
}
