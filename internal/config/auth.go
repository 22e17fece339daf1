package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/quota"
)

// Auth says who may call the HTTP API and which Host names it answers to.
// With no keys (neither Keys nor KeysFile) every caller is anonymous and may
// do everything; Validate allows that only on a loopback listen, or with
// Anonymous set.
type Auth struct {
	// Keys are API keys given in the file itself.
	Keys []Key `yaml:"keys"`
	// KeysFile is a YAML list of more keys, read at start and again on
	// SIGHUP (Service.Reload).
	KeysFile string `yaml:"keys_file"`
	// Hosts are the accepted Host header values (names, or name:port).
	// Without keys, Host must be one of them, a loopback address or
	// localhost (against DNS rebinding); with keys, Host is checked only
	// when Hosts is set.
	Hosts []string `yaml:"hosts"`
	// Anonymous allows a non-loopback listen without keys.
	Anonymous bool `yaml:"anonymous"`
	// PublicMetrics serves /metrics without a key; otherwise it needs the
	// read scope.
	PublicMetrics bool `yaml:"public_metrics"`
}

// Key is one API key. The file never holds the secret, only its SHA-256.
type Key struct {
	// ID names the key in logs (who did what); unique.
	ID string `yaml:"id"`
	// SHA256 is the hex SHA-256 of the secret a client sends as
	// Authorization: Bearer <secret>.
	SHA256 string `yaml:"sha256"`
	// Scopes: submit, submit:<lane>, read, admin (admin implies the others).
	Scopes []string `yaml:"scopes"`
	// Plan names the caller plan the key's requests count against
	// (callers.plans); empty: callers.default_plan. Without a callers
	// section it is checked for form only.
	Plan string `yaml:"plan"`
}

// Digest returns the key's SHA-256; valid after Validate (or LoadKeys).
func (k Key) Digest() [32]byte {
	var d [32]byte
	_, _ = hex.Decode(d[:], []byte(k.SHA256))
	return d
}

// Scope names; docs/API.md lists what each one allows.
const (
	ScopeSubmit = "submit"
	ScopeRead   = "read"
	ScopeAdmin  = "admin"
)

// ParseScope splits a scope into its name and, for submit:<lane>, the lane.
// It does not check that the lane exists.
func ParseScope(s string) (name, lane string, err error) {
	name, lane, hasLane := strings.Cut(s, ":")
	switch {
	case name == ScopeSubmit && !hasLane:
		return name, "", nil
	case name == ScopeSubmit && laneName.MatchString(lane):
		return name, lane, nil
	case (name == ScopeRead || name == ScopeAdmin) && !hasLane:
		return name, "", nil
	}
	return "", "", fmt.Errorf("%q is not one of submit, submit:<lane>, read, admin", s)
}

// TLS serves the API over HTTPS. Empty: plain HTTP.
type TLS struct {
	// CertFile and KeyFile are PEM files; both are read again on SIGHUP.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile turns on mutual TLS: every client must present a
	// certificate signed by one of these CAs (PEM).
	ClientCAFile string `yaml:"client_ca_file"`
}

// HTTP bounds what the HTTP server gives any one client.
type HTTP struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout Duration `yaml:"read_timeout"`
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// IdleTimeoutUnderLoad closes a keep-alive connection idle this long
	// while three quarters of MaxConnections are open; zero means
	// DefaultIdleTimeoutUnderLoad, or IdleTimeout if that is less
	// (IdleUnderLoad).
	IdleTimeoutUnderLoad Duration `yaml:"idle_timeout_under_load"`
	// MaxConnections bounds open connections. A new one over it closes
	// the longest-idle keep-alive connection instead; with none idle it is
	// answered 503 and closed.
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerIP bounds the connections of one client IP (the
	// socket peer; callers.trusted_proxies are exempt) in the same way;
	// zero means an eighth of MaxConnections, at least 16 (or
	// MaxConnections if that is less): ConnectionsPerIP.
	MaxConnectionsPerIP int `yaml:"max_connections_per_ip"`
	// MaxBodyInflight bounds the bytes of request bodies being read at
	// once across all requests; a request over it is answered 503.
	MaxBodyInflight ByteSize `yaml:"max_body_inflight"`
	// MaxBodyInflightPerCaller bounds the part of MaxBodyInflight that
	// one caller (API key, else client IP) may hold; a request over it is
	// answered 429. Zero means a quarter of MaxBodyInflight, raised to
	// the largest body a caller may send (BodyInflightPerCaller).
	MaxBodyInflightPerCaller ByteSize `yaml:"max_body_inflight_per_caller"`
	// MaxBatchItems bounds the jobs of one batch submission
	// (POST /v1/lanes/{lane}/jobs:batch).
	MaxBatchItems int `yaml:"max_batch_items"`
	// MaxBatchBytes bounds the body of one batch submission; zero means
	// 8 MiB, or MaxBodyInflight if that is less (BatchBytes).
	MaxBatchBytes ByteSize `yaml:"max_batch_bytes"`
}

// DefaultMaxBatchBytes is http.max_batch_bytes when the file leaves it out
// (and max_body_inflight is not smaller).
const DefaultMaxBatchBytes = 8 << 20

// BatchBytes is the bound of one batch body: max_batch_bytes, else the
// default capped at max_body_inflight.
func (h HTTP) BatchBytes() int64 {
	if h.MaxBatchBytes > 0 {
		return int64(h.MaxBatchBytes)
	}
	return min(DefaultMaxBatchBytes, int64(h.MaxBodyInflight))
}

// DefaultIdleTimeoutUnderLoad is http.idle_timeout_under_load when the
// file leaves it out (and idle_timeout is not shorter).
const DefaultIdleTimeoutUnderLoad = 5 * time.Second

// IdleUnderLoad is the idle timeout of keep-alive connections while the
// server nears max_connections: idle_timeout_under_load, else the default
// capped at idle_timeout.
func (h HTTP) IdleUnderLoad() time.Duration {
	if h.IdleTimeoutUnderLoad > 0 {
		return h.IdleTimeoutUnderLoad.D()
	}
	return min(DefaultIdleTimeoutUnderLoad, h.IdleTimeout.D())
}

// ConnectionsPerIP is the bound of one client IP's connections:
// max_connections_per_ip, else an eighth of max_connections, at least 16
// (or max_connections if that is less): a client pooling a few dozen
// connections stays served, and with the default 1024 it takes eight IPs
// with connections that are all busy to hold every slot.
func (h HTTP) ConnectionsPerIP() int {
	if h.MaxConnectionsPerIP > 0 {
		return h.MaxConnectionsPerIP
	}
	return max(min(16, h.MaxConnections), h.MaxConnections/8)
}

// BodyInflightPerCaller is the part of max_body_inflight one caller may
// hold: max_body_inflight_per_caller, else a quarter of max_body_inflight
// raised to the largest body one request may send (a lane's max_body, a
// batch), so that every request stays possible.
func (c *Config) BodyInflightPerCaller() int64 {
	h := c.HTTP
	if h.MaxBodyInflightPerCaller > 0 {
		return int64(h.MaxBodyInflightPerCaller)
	}
	return min(int64(h.MaxBodyInflight), max(int64(h.MaxBodyInflight)/4, c.largestBody()))
}

// largestBody is the largest body one request may send: a batch, or a
// lane's max_body.
func (c *Config) largestBody() int64 {
	n := c.HTTP.BatchBytes()
	for _, l := range c.Lanes {
		n = max(n, int64(l.MaxBody))
	}
	return n
}

// DefaultHTTP is the http section a file leaves out.
func DefaultHTTP() HTTP {
	return HTTP{
		ReadHeaderTimeout: Duration(10 * time.Second),
		ReadTimeout:       Duration(30 * time.Second),
		IdleTimeout:       Duration(2 * time.Minute),
		MaxConnections:    1024,
		MaxBodyInflight:   64 << 20,
		MaxBatchItems:     1000,
	}
}

var (
	keyID   = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	hexSum  = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	hostRe  = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$`)
	maxKeys = 10_000
)

// LoopbackListen reports whether listen binds only loopback addresses (a
// loopback IP, or localhost).
func (c *Config) LoopbackListen() bool {
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && host == "localhost" {
		return true
	}
	ap, err := netip.ParseAddrPort(c.Listen)
	return err == nil && ap.Addr().IsLoopback()
}

// HasKeys reports whether the API takes API keys (auth.keys or
// auth.keys_file); without them every caller is anonymous.
func (c *Config) HasKeys() bool { return len(c.Auth.Keys) > 0 || c.Auth.KeysFile != "" }

// validateAccess checks the auth, tls and http sections.
func (c *Config) validateAccess() error {
	fail := func(field, format string, args ...any) error {
		return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	a := c.Auth
	if err := validateKeys("auth.keys", a.Keys, c.Lanes, c.Callers); err != nil {
		return err
	}
	if a.Anonymous && c.HasKeys() {
		return fail("auth.anonymous", "cannot be true while auth.keys or auth.keys_file give keys")
	}
	if !c.HasKeys() && !a.Anonymous && !c.LoopbackListen() {
		return fail("auth", "listen %s is not a loopback address and no API keys are configured: set auth.keys or auth.keys_file, or auth.anonymous: true to serve everyone without a key", c.Listen)
	}
	for i, h := range a.Hosts {
		if !hostRe.MatchString(h) {
			return fail(fmt.Sprintf("auth.hosts[%d]", i), "%q is not a host name or host:port", h)
		}
	}
	t := c.TLS
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return fail("tls", "cert_file and key_file go together")
	case t.ClientCAFile != "" && t.CertFile == "":
		return fail("tls.client_ca_file", "needs tls.cert_file and tls.key_file")
	}
	h := c.HTTP
	switch {
	case h.ReadHeaderTimeout <= 0:
		return fail("http.read_header_timeout", "must be greater than 0")
	case h.ReadTimeout <= 0:
		return fail("http.read_timeout", "must be greater than 0")
	case h.IdleTimeout <= 0:
		return fail("http.idle_timeout", "must be greater than 0")
	case h.IdleTimeoutUnderLoad < 0:
		return fail("http.idle_timeout_under_load", "must not be negative")
	case h.IdleTimeoutUnderLoad > h.IdleTimeout:
		return fail("http.idle_timeout_under_load", "%s is longer than http.idle_timeout (%s)", h.IdleTimeoutUnderLoad.D(), h.IdleTimeout.D())
	case h.MaxConnections < 1 || h.MaxConnections > 1_000_000:
		return fail("http.max_connections", "must be between 1 and 1000000, got %d", h.MaxConnections)
	case h.MaxConnectionsPerIP < 0 || h.MaxConnectionsPerIP > h.MaxConnections:
		return fail("http.max_connections_per_ip", "must be between 1 and http.max_connections (%d), got %d", h.MaxConnections, h.MaxConnectionsPerIP)
	case h.MaxBatchItems < 1 || h.MaxBatchItems > 100_000:
		return fail("http.max_batch_items", "must be between 1 and 100000, got %d", h.MaxBatchItems)
	case h.MaxBatchBytes < 0:
		return fail("http.max_batch_bytes", "must not be negative")
	case h.MaxBatchBytes > h.MaxBodyInflight:
		return fail("http.max_batch_bytes", "%d bytes is more than http.max_body_inflight (%d): such a batch could never be read", int64(h.MaxBatchBytes), int64(h.MaxBodyInflight))
	}
	for i, l := range c.Lanes {
		if l.MaxBody > h.MaxBodyInflight {
			return fail("http.max_body_inflight", "%d bytes is less than lanes[%d].max_body (%d): such a body could never be read", int64(h.MaxBodyInflight), i, int64(l.MaxBody))
		}
	}
	if p := h.MaxBodyInflightPerCaller; p != 0 {
		switch {
		case p < 0:
			return fail("http.max_body_inflight_per_caller", "must not be negative")
		case p > h.MaxBodyInflight:
			return fail("http.max_body_inflight_per_caller", "%d bytes is more than http.max_body_inflight (%d)", int64(p), int64(h.MaxBodyInflight))
		case int64(p) < c.largestBody():
			return fail("http.max_body_inflight_per_caller", "%d bytes is less than the largest body one request may send (%d: http.max_batch_bytes or a lane's max_body): such a body could never be read", int64(p), c.largestBody())
		}
	}
	return nil
}

// validateKeys checks a list of keys; field names the list ("auth.keys",
// or "" for a keys file, whose entries are then [0], [1], …).
func validateKeys(field string, keys []Key, lanes []Lane, callers *Callers) error {
	if len(keys) > maxKeys {
		return &Error{Field: field, Msg: fmt.Sprintf("%d keys; at most %d", len(keys), maxKeys)}
	}
	known := map[string]bool{}
	for _, l := range lanes {
		known[l.Name] = true
	}
	seen := map[string]int{}
	for i, k := range keys {
		p := fmt.Sprintf("%s[%d]", field, i)
		fail := func(f, format string, args ...any) error {
			return &Error{Field: p + "." + f, Msg: fmt.Sprintf(format, args...)}
		}
		if !keyID.MatchString(k.ID) {
			return fail("id", "%q must be 1-64 letters, digits, '_', '.' or '-'", k.ID)
		}
		if j, dup := seen[k.ID]; dup {
			return fail("id", "%q is already the id of %s[%d]", k.ID, field, j)
		}
		seen[k.ID] = i
		if !hexSum.MatchString(k.SHA256) {
			// Never quote the value: it may be a secret put in the wrong place.
			return fail("sha256", "must be the SHA-256 of the secret as 64 hex characters (got %d characters); the file never holds the secret itself", len(k.SHA256))
		}
		if len(k.Scopes) == 0 {
			return fail("scopes", "at least one scope is required (submit, submit:<lane>, read, admin)")
		}
		for j, s := range k.Scopes {
			_, lane, err := ParseScope(s)
			if err != nil {
				return fail(fmt.Sprintf("scopes[%d]", j), "%v", err)
			}
			if lane != "" && !known[lane] {
				return fail(fmt.Sprintf("scopes[%d]", j), "no lane named %q is configured", lane)
			}
		}
		if k.Plan != "" && !quota.ValidPlanName(k.Plan) {
			return fail("plan", "%q must be 1-64 letters, digits, '_' or '-'", k.Plan)
		}
		if _, ok := callers.plan(k.Plan); k.Plan != "" && callers != nil && !ok {
			return fail("plan", "no plan named %q in callers.plans", k.Plan)
		}
	}
	return nil
}

// LoadKeys returns every API key: auth.keys, then the entries of
// auth.keys_file read now. Ids must be unique across both. A keys file must
// hold at least one key (an empty one would open the API). Errors about
// the file name it as their File.
func (c *Config) LoadKeys() ([]Key, error) {
	keys := append([]Key(nil), c.Auth.Keys...)
	if c.Auth.KeysFile == "" {
		return keys, nil
	}
	path := c.Auth.KeysFile
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Field: "auth.keys_file", Msg: err.Error(), Err: err}
	}
	var fromFile []Key
	if err := decodeStrict(raw, &fromFile, keysFileSecret, c.getenv); err != nil {
		return nil, inFile(err, path)
	}
	if len(fromFile) == 0 {
		return nil, &Error{File: path, Msg: "no keys: a keys file must list at least one key"}
	}
	if err := validateKeys("", fromFile, c.Lanes, c.Callers); err != nil {
		return nil, inFile(err, path)
	}
	for i, k := range fromFile {
		for j, o := range c.Auth.Keys {
			if o.ID == k.ID {
				return nil, &Error{File: path, Field: fmt.Sprintf("[%d].id", i), Msg: fmt.Sprintf("%q is already the id of auth.keys[%d]", k.ID, j)}
			}
		}
	}
	return append(keys, fromFile...), nil
}

// inFile names path as the file of a config error.
func inFile(err error, path string) error {
	var ce *Error
	if errors.As(err, &ce) {
		ce.File = path
	}
	return err
}
