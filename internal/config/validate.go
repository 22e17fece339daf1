package config

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// workerUser is what a worker's user name may be: it is also a token of
// its inbox prefix, _INBOX.<user>.
var workerUser = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

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

// Error is a configuration error that names the file and the field. Err,
// when set, is the error it was made from (reading a file, a value that
// does not parse), kept in the chain: Msg says it for a reader, Unwrap
// gives it to errors.Is and errors.As.
type Error struct {
	File  string
	Field string
	Msg   string
	Err   error
}

// Unwrap returns the error e was made from, or nil.
func (e *Error) Unwrap() error { return e.Err }

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

// validate checks nats.pull_login: user and password together, or one
// creds_file, or one nkey_seed_file.
func (l NATSLogin) validate() error {
	fail := func(field, msg string) error { return &Error{Field: "nats.pull_login." + field, Msg: msg} }
	if (l.User == "") != (l.Password == "") {
		return fail("password", "user and password go together")
	}
	n := 0
	for _, set := range []bool{l.User != "", l.CredsFile != "", l.NkeySeedFile != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return fail("creds_file", "give one of user and password, creds_file, nkey_seed_file")
	}
	return nil
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
		if r := l.Results; r != nil && r.Keep < c.NATS.DedupWindow {
			// A resubmission after the record is gone but within the
			// window would create a record afresh while JetStream drops
			// its job as a duplicate: a record no job ever settles.
			return fail(p+".results.keep", "is %v, shorter than nats.dedup_window (%v): an Idempotency-Key must be remembered by the record at least as long as by JetStream", r.Keep.D(), c.NATS.DedupWindow.D())
		}
	}
	if err := c.validateWorkSubjects(); err != nil {
		return err
	}
	if err := c.validateCallbacks(); err != nil {
		return err
	}
	if err := c.validateReplies(); err != nil {
		return err
	}
	if c.Callers != nil {
		if err := c.Callers.validate(); err != nil {
			return err
		}
	}
	return c.validateAccess()
}

// validateCallbacks checks each lane's results.callback_lane: a lane of
// this config with an HTTP target whose job_urls cover every prefix of
// results.callback_urls (the callback lane's target checks each
// callback's URL against its job_urls before sending it).
func (c *Config) validateCallbacks() error {
	at := map[string]int{}
	for i, l := range c.Lanes {
		at[l.Name] = i
	}
	for i, l := range c.Lanes {
		r := l.Results
		if r == nil || r.CallbackLane == "" {
			continue
		}
		field := fmt.Sprintf("lanes[%d].results.callback_lane", i)
		j, ok := at[r.CallbackLane]
		if !ok {
			return &Error{Field: field, Msg: fmt.Sprintf("no lane is named %q", r.CallbackLane)}
		}
		cl := c.Lanes[j]
		h := cl.Target.HTTP
		switch {
		case h == nil:
			return &Error{Field: field, Msg: fmt.Sprintf("lanes[%d] (%s) has no http target: callbacks are HTTP requests", j, r.CallbackLane)}
		case h.Method != "" && h.Method != http.MethodPost:
			return &Error{Field: field, Msg: fmt.Sprintf("lanes[%d] (%s) sends with method %s: callbacks are POSTed", j, r.CallbackLane, h.Method)}
		case cl.PerKey != nil:
			return &Error{Field: field, Msg: fmt.Sprintf("lanes[%d] (%s) is keyed (per_key): callbacks have no key", j, r.CallbackLane)}
		case int64(cl.MaxBody) < r.MaxRecord():
			return &Error{Field: fmt.Sprintf("lanes[%d].max_body", j),
				Msg: fmt.Sprintf("is %d bytes; lanes[%d] (%s) sends its callbacks through this lane, and a callback carries a record of up to %d bytes (twice results.max_body and 64KiB)", cl.MaxBody, i, l.Name, r.MaxRecord())}
		}
		rules, err := dest.New(h.DestConfig())
		if err != nil {
			return &Error{Field: fmt.Sprintf("lanes[%d].target.http", j), Msg: err.Error()}
		}
		cb, err := dest.NewPrefixes(r.CallbackURLs)
		if err != nil {
			return &Error{Field: fmt.Sprintf("lanes[%d].results.callback_urls", i), Msg: err.Error()}
		}
		if k := rules.Uncovered(cb); k >= 0 {
			return &Error{Field: fmt.Sprintf("lanes[%d].results.callback_urls[%d]", i, k),
				Msg: fmt.Sprintf("%q is not under any of lanes[%d] (%s) target.http.job_urls: the callback lane would refuse its callbacks", r.CallbackURLs[k], j, r.CallbackLane)}
		}
	}
	return nil
}

// validateReplies checks each lane's results.reply_subjects with the rule
// the drain applies to every Throttle-Reply (records.NewReplies: no
// wildcard, nothing of the throttler's, the server's or a worker's inbox),
// and refuses a prefix that covers, or lies under, a subject a lane's NATS
// target delivers on: a record published there would reach the workers as
// a job or a pull request.
func (c *Config) validateReplies() error {
	workers := map[string][]string{}
	for _, l := range c.Lanes {
		if l.Target.Pull() {
			workers[l.Name] = c.NATS.WorkersOf(l.Name)
		}
	}
	for i, l := range c.Lanes {
		if l.Results == nil || len(l.Results.ReplySubjects) == 0 {
			continue
		}
		field := fmt.Sprintf("lanes[%d].results.reply_subjects", i)
		if _, err := records.NewReplies(records.ReplyRules{Prefixes: l.Results.ReplySubjects, Workers: workers}); err != nil {
			var pe *records.PrefixError
			if errors.As(err, &pe) {
				return &Error{Field: fmt.Sprintf("%s[%d]", field, pe.Index), Msg: pe.Err.Error()}
			}
			return &Error{Field: field, Msg: err.Error()}
		}
		for k, p := range l.Results.ReplySubjects {
			for j, o := range c.Lanes {
				if o.Target.NATS == nil {
					continue
				}
				if t := o.Target.NATS.Subject; subjectUnder(p, t) || subjectUnder(t, p) {
					return &Error{Field: fmt.Sprintf("%s[%d]", field, k),
						Msg: fmt.Sprintf("%q overlaps lanes[%d] (%s) target.nats.subject %q: a record published there would reach its workers", p, j, o.Name, t)}
				}
			}
		}
	}
	return nil
}

// subjectUnder reports whether subject s is p or under p at a token
// boundary.
func subjectUnder(s, p string) bool {
	return s == p || strings.HasPrefix(s, p) && s[len(p)] == '.'
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
	if r := l.Results; r != nil {
		if err := r.validate(fail); err != nil {
			return err
		}
	}
	switch {
	case l.MaxWait < 0:
		return fail("max_wait", "must not be negative")
	case l.MaxAge < 0:
		return fail("max_age", "must not be negative")
	case l.MaxDelay < 0 || l.MaxDelay > Duration(queue.MaxDelayLimit):
		return fail("max_delay", "must be between 0 and %v, got %v", queue.MaxDelayLimit, l.MaxDelay.D())
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
	if k := l.PerKey; k != nil && k.KeyFrom != "" {
		if k.KeyFrom != dest.KeyFromURLHost {
			return fail("per_key.key_from", "%q is not one of %s (or empty: every job names its key)", k.KeyFrom, dest.KeyFromURLHost)
		}
		if h := l.Target.HTTP; h == nil || len(h.JobURLs) == 0 {
			return fail("per_key.key_from", "%s takes a job's key from the host of its URL: the lane needs an http target that lists target.http.job_urls", dest.KeyFromURLHost)
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
	if _, err := dest.New(h.DestConfig()); err != nil {
		var fe *dest.FieldError
		if errors.As(err, &fe) {
			return fail("target.http."+fe.Field, "%s", fe.Detail)
		}
		return fail("target.http", "%v", err)
	}
	if k := l.PerKey; k != nil && k.KeyFrom == dest.KeyFromURLHost {
		// Every job URL is under one of job_urls, on its host and port:
		// the keys a url_host lane can give are these prefixes' keys.
		for i, s := range h.JobURLs {
			key, err := dest.HostKey(s)
			if err == nil {
				err = queue.ValidKey(key)
			}
			if err != nil {
				return fail(fmt.Sprintf("target.http.job_urls[%d]", i), "its host cannot be a key (per_key.key_from: %s): %v", dest.KeyFromURLHost, err)
			}
		}
	}
	hc := dispatch.HTTPConfig{URL: h.URL, Method: h.Method, Headers: h.Headers, Timeout: h.Timeout.D(), RetryOther4xx: h.RetryOther4xx,
		Methods: h.Methods, ForwardHeaders: h.ForwardHeaders, JobURLs: h.JobURLs}
	if err := hc.Validate(); err != nil {
		return fail("target.http", "%v", err)
	}
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
		if n.PullLogin.Set() {
			return fail("pull_login", "is for an external server (nats.url); the embedded server creates its pull user (%s) itself", EmbeddedPullUser)
		}
	} else {
		if len(n.Publishers) > 0 {
			return fail("publishers", "are users of the embedded server; on an external server give them the permissions in docs/OPERATIONS.md")
		}
		if err := n.PullLogin.validate(); err != nil {
			return err
		}
	}
	if (n.TLS.CertFile == "") != (n.TLS.KeyFile == "") {
		return fail("tls.key_file", "tls.cert_file and tls.key_file go together")
	}
	known := map[string]bool{}
	for _, l := range lanes {
		known[l.Name] = true
	}
	if embedded && n.User == EmbeddedPullUser {
		return fail("user", "%q is the embedded server's pull user; choose another name", n.User)
	}
	users := map[string]bool{n.User: true, EmbeddedPullUser: true}
	for i, p := range n.Publishers {
		f := fmt.Sprintf("publishers[%d]", i)
		switch {
		case p.User == "" || p.Password == "":
			return fail(f, "needs user and password")
		case !workerUser.MatchString(p.User):
			return fail(f+".user", "%q must be 1-64 letters, digits, '_' or '-' (it names the publisher's inbox, _INBOX.<user>)", p.User)
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
		case embedded && (w.User == "" || w.Password == ""):
			return fail(f, "needs user and password")
		case !embedded && w.Password != "":
			return fail(f+".password", "is for the embedded server; with nats.url the server holds the worker's password (list its user only)")
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
