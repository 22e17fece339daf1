package ingest

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/throttler/throttler/api"
)

// Problem types of the access checks; docs/API.md documents each.
const (
	ProblemUnauthorized = "urn:throttler:problem:unauthorized"
	ProblemForbidden    = "urn:throttler:problem:forbidden"
	ProblemCrossSite    = "urn:throttler:problem:cross-site"
	ProblemUnknownHost  = "urn:throttler:problem:unknown-host"
)

// Auth says who may call the API.
type Auth struct {
	// Keys are the accepted API keys. None: every caller is anonymous and
	// may do everything, and the Host must be a loopback address,
	// localhost or one of Hosts (against DNS rebinding). The choice is
	// made once, at New: SetKeys cannot switch it.
	Keys []Key
	// Hosts are the accepted Host header values: a name matches any port,
	// name:port only that port. With keys, an empty list accepts any Host.
	Hosts []string
	// PublicMetrics serves /metrics without a key; otherwise it needs Read.
	PublicMetrics bool
}

// Key is one API key: who holds it, the SHA-256 of its secret, and what it
// may do.
type Key struct {
	ID     string
	SHA256 [sha256.Size]byte
	Scopes Scopes
	// Plan names the caller plan the key counts against (Callers); "":
	// the default plan.
	Plan string
}

// Scopes is what a key may do. Admin implies Read and Submit.
type Scopes struct {
	Admin  bool
	Read   bool
	Submit bool
	// SubmitLanes are lanes the key may submit to (submit:<lane>).
	SubmitLanes []string
}

// Errors of SetKeys.
var (
	// ErrNoKeys: an empty key list for a handler built with keys; taking
	// it would lock every caller out (or, read as "no keys", open the API).
	ErrNoKeys = errors.New("ingest: no keys")
	// ErrAnonymous: keys for a handler built without any; whether the API
	// takes keys is decided once, at New.
	ErrAnonymous = errors.New("ingest: the API was started without keys")
)

// keySet is one immutable generation of keys.
type keySet struct{ keys []Key }

// compareDigest compares two digests in constant time; a variable so that a
// test can count the comparisons.
var compareDigest = subtle.ConstantTimeCompare

// match finds the key whose digest is the SHA-256 of secret, or of secret
// and a newline (what `openssl rand -hex 32 | tee secret | sha256sum`
// hashes, while the header carries the secret without it), or nil. It
// compares both digests with every key, without stopping at a match and
// without a branch on the outcome, so that the time taken does not say
// which key (if any) matched.
func (s *keySet) match(secret string) *Key {
	sum := sha256.Sum256([]byte(secret))
	sumLine := sha256.Sum256([]byte(secret + "\n"))
	found := -1
	for i := range s.keys {
		k := s.keys[i].SHA256[:]
		eq := compareDigest(sum[:], k) | compareDigest(sumLine[:], k)
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return nil
	}
	return &s.keys[found]
}

// SetKeys replaces the API keys at once (keys_file reloaded on SIGHUP):
// requests already authorized finish with the key they had, the next ones
// see the new set. It refuses an empty list (ErrNoKeys) and any keys for a
// handler built without them (ErrAnonymous).
func (h *Handler) SetKeys(keys []Key) error {
	switch {
	case h.keys.Load() == nil:
		return ErrAnonymous
	case len(keys) == 0:
		return ErrNoKeys
	}
	h.keys.Store(&keySet{keys: append([]Key(nil), keys...)})
	return nil
}

// need is what a route asks of its caller.
type need int

const (
	needNothing need = iota
	needRead
	needSubmit // to the request's {lane}
	needAdmin
	// needKey: any known key, whatever its scopes (who am I).
	needKey
)

func (n need) String() string {
	switch n {
	case needRead:
		return "read"
	case needSubmit:
		return "submit"
	case needAdmin:
		return "admin"
	case needKey:
		return "any"
	}
	return "none"
}

func (s Scopes) allow(n need, lane string) bool {
	switch n {
	case needNothing:
		return true
	case needRead:
		return s.Admin || s.Read
	case needSubmit:
		if s.Admin || s.Submit {
			return true
		}
		for _, l := range s.SubmitLanes {
			if l == lane {
				return true
			}
		}
	case needAdmin:
		return s.Admin
	case needKey:
		return true
	}
	return false
}

type callerCtx struct{}

// scopesCtx holds the Scopes of the request's key.
type scopesCtx struct{}

// whoami answers who the caller's key is and what it may do (the status
// page shows admin controls only to admin keys; the server checks each
// call anyway).
func (h *Handler) whoami(w http.ResponseWriter, r *http.Request) {
	out := api.Whoami{Anonymous: true, Admin: true, Read: true, Submit: true}
	if s, ok := r.Context().Value(scopesCtx{}).(Scopes); ok {
		out = api.Whoami{Key: callerOf(r), Admin: s.Admin, Read: s.Admin || s.Read, Submit: s.Admin || s.Submit,
			SubmitLanes: s.SubmitLanes}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// authorize wraps a route that needs n and submits no job: without keys
// every caller passes as anonymous; with keys the request must carry a
// known one (401) that has the scope (403). The per-IP caller quota comes
// first (guard).
func (h *Handler) authorize(n need, next http.HandlerFunc) http.HandlerFunc {
	return h.guard(n, -1, next)
}

// identify finds the request's key in set and whether it may call a route
// that needs n, without answering: refusal, when not nil, answers 401 or
// 403.
func (h *Handler) identify(w http.ResponseWriter, r *http.Request, set *keySet, n need) (*Key, func()) {
	secret, why := bearer(r.Header.Get("Authorization"))
	if why != "" {
		return nil, func() {
			h.refuse(w, r, "anonymous", why, refusal(ErrUnauthorized, "", "%s", why))
		}
	}
	k := set.match(secret)
	if k == nil {
		return nil, func() {
			h.refuse(w, r, "unknown key", "unknown_key", refusal(ErrUnauthorized, "", "the API key is not known"))
		}
	}
	lane := r.PathValue("lane")
	if !k.Scopes.allow(n, lane) {
		return k, func() {
			scope := n.String()
			if n == needSubmit {
				scope = fmt.Sprintf("submit or submit:%s", lane)
			}
			h.refuse(w, r, k.ID, "missing_scope", refusal(ErrForbidden, "", "the API key %s lacks the %s scope that %s needs", k.ID, scope, route(r)))
		}
	}
	return k, nil
}

// bearer takes the secret out of an Authorization header; why says what
// is wrong with it (also the log's reason).
func bearer(h string) (secret, why string) {
	if h == "" {
		return "", "no Authorization header: send Authorization: Bearer <API key>"
	}
	scheme, rest, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", "the Authorization scheme must be Bearer"
	}
	secret = strings.TrimLeft(rest, " ")
	if secret == "" {
		return "", "the Bearer token is empty"
	}
	return secret, ""
}

// refuse answers an access check's refusal err (problemFor) and logs it
// with who asked (caller), the route and why (reason).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, caller, reason string, err error) {
	p := problemFor(err)
	h.cfg.Logger.Warn("request refused", "caller", clip(caller), "ip", clientIP(r), "route", route(r), "status", p.Status,
		"field", p.Field, "reason", reason)
	if p.Status == http.StatusUnauthorized {
		v := `Bearer realm="throttler"`
		if reason == "unknown_key" {
			v += `, error="invalid_token"`
		}
		w.Header().Set("WWW-Authenticate", v)
	}
	writeProblem(w, r, p, 0)
}

// route names the request's route for logs: its pattern once routed, else
// method and path (each cut by clip).
func route(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return clip(r.Method) + " " + clip(r.URL.Path)
}

// checkBrowser refuses what a browser can be made to send against the
// caller's will: a Host that is not ours (DNS rebinding) and state-changing
// requests from another site (CSRF, including "simple" cross-site POSTs).
// It reports whether the request may go on.
func (h *Handler) checkBrowser(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
		return true // probes address the pod by IP; nothing to steal there
	}
	if !h.hostAllowed(r.Host) {
		h.refuse(w, r, callerOf(r), "unknown_host", refusal(ErrUnknownHost, "", "this server does not answer to Host %q", clip(r.Host)))
		return false
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	if why := crossSite(r); why != "" {
		h.refuse(w, r, callerOf(r), "cross_site", refusal(ErrCrossSite, "", "%s", why))
		return false
	}
	return true
}

func (h *Handler) hostAllowed(host string) bool {
	hosts := h.cfg.Auth.Hosts
	if hostAllowed(host, hosts) {
		return true
	}
	if h.keys.Load() == nil {
		return loopbackHost(host)
	}
	return len(hosts) == 0
}

// hostAllowed: host (a Host header) is one of hosts; an entry with a port
// must match exactly, one without matches any port. Case-insensitive.
func hostAllowed(host string, hosts []string) bool {
	name := hostName(host)
	for _, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err == nil {
			if strings.EqualFold(h, host) {
				return true
			}
		} else if strings.EqualFold(strings.Trim(h, "[]"), name) {
			return true
		}
	}
	return false
}

// loopbackHost: localhost or a loopback IP, with or without a port.
func loopbackHost(host string) bool {
	name := hostName(host)
	if strings.EqualFold(name, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(name)
	return err == nil && a.Unmap().IsLoopback()
}

// hostName is the name part of a Host header, without port or brackets.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return strings.Trim(host, "[]")
}

// crossSite says why a state-changing request comes from another site, or
// "" when it does not: Sec-Fetch-Site (sent by every current browser) says
// cross-site or same-site, or Origin names another host:port than Host.
// Requests without either header (curl, servers) pass.
func crossSite(r *http.Request) string {
	switch s := r.Header.Get("Sec-Fetch-Site"); s {
	case "cross-site", "same-site":
		return fmt.Sprintf("Sec-Fetch-Site is %s: state-changing requests from browser pages of other sites are refused", s)
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return ""
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if oh := hostPort(o); oh == "" || oh != hostPort(scheme+"://"+r.Host) {
		return fmt.Sprintf("Origin %q is not this server (%s): state-changing requests from browser pages of other origins are refused", clip(o), clip(r.Host))
	}
	return ""
}

// hostPort is the lower-case host:port of an origin, with the scheme's
// default port; "" for an opaque origin ("null") or a bad one.
func hostPort(origin string) string {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		switch strings.ToLower(u.Scheme) {
		case "https":
			port = "443"
		case "http":
			port = "80"
		default:
			return ""
		}
	}
	return strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}
