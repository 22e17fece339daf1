package dispatch

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"code.dny.dev/ssrf"
)

// FuzzDownstreamSignals feeds arbitrary header values to the parsers of
// Retry-After, X-RateLimit-* / RateLimit-* and the IETF RateLimit header:
// they never panic, every wait is in (0, MaxPause], a Retry-After wait comes
// only with 429 or 503, and the pause is the longest wait asked for.
func FuzzDownstreamSignals(f *testing.F) {
	f.Fuzz(func(t *testing.T, status int, retryAfter, remaining, reset, rateLimit string) {
		check := func(name string, wait time.Duration, ok bool) {
			if ok != (wait > 0) || wait < 0 || wait > MaxPause {
				t.Fatalf("%s: wait %v ok %v, want a wait in (0, %v] exactly when ok", name, wait, ok, MaxPause)
			}
		}
		d, ok := parseRetryAfter(retryAfter, t0)
		check("Retry-After", d, ok)
		d, ok = parseReset(reset, t0)
		check("reset", d, ok)
		d, ok = parseRateLimit(rateLimit)
		check("RateLimit", d, ok)
		d, ok = parseDeltaSeconds(reset)
		check("delta-seconds", d, ok)
		h := http.Header{}
		h.Set("Retry-After", retryAfter)
		h.Set("X-RateLimit-Remaining", remaining)
		h.Set("X-RateLimit-Reset", reset)
		h.Set("RateLimit-Remaining", remaining)
		h.Set("RateLimit-Reset", reset)
		h.Add("RateLimit", rateLimit)
		ra, pause := downstreamSignals(status, h, t0)
		switch {
		case ra < 0 || ra > MaxPause || pause < 0 || pause > MaxPause:
			t.Fatalf("retryAfter %v pause %v: out of [0, %v]", ra, pause, MaxPause)
		case ra > 0 && status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable:
			t.Fatalf("status %d gave a Retry-After wait of %v", status, ra)
		case pause < ra:
			t.Fatalf("pause %v is shorter than the Retry-After wait %v", pause, ra)
		}
	})
}

// libGuard is the reference: package ssrf's own check, any port and
// network, with NAT64 allowed so that it is judged, like ours, on the
// IPv4 address inside.
var libGuard = ssrf.New(ssrf.WithAnyPort(), ssrf.WithAnyNetwork())

// specialPurpose reports whether a is an address no target may be on
// without an allowlist: refused by package ssrf (after unmapping, and on
// the IPv4 address inside a NAT64 address) or Azure's platform address.
func specialPurpose(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	if nat64Prefix.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:16]))
	}
	return libGuard.SafeAddr(a) != nil || a == netip.MustParseAddr("168.63.129.16")
}

// FuzzGuard turns arbitrary bytes into addresses (raw 4 or 16 bytes, or
// text) and host names, and checks the guard: it never panics, never allows
// a special-purpose address, always allows an address inside an allowed
// prefix, and its DialContext never dials a special-purpose address that a
// name resolves to.
func FuzzGuard(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, bits uint8) {
		var cands []netip.Addr
		if a, ok := netip.AddrFromSlice(data); ok {
			cands = append(cands, a)
		}
		if a, err := netip.ParseAddr(string(data)); err == nil {
			cands = append(cands, a)
		}
		open := NewGuard(nil)
		for _, a := range cands {
			err := open.Check(a)
			if err != nil && !errors.Is(err, ErrForbiddenAddress) {
				t.Fatalf("Check(%s) = %v: not ErrForbiddenAddress", a, err)
			}
			if err == nil && specialPurpose(a) {
				t.Fatalf("Check(%s) allowed a special-purpose address", a)
			}
			p, err := a.WithZone("").Prefix(int(bits) % (a.BitLen() + 1))
			if err != nil {
				t.Fatal(err)
			}
			if err := NewGuard([]netip.Prefix{p}).Check(a); err != nil {
				t.Fatalf("Check(%s) with %s allowed: %v", a, p, err)
			}
		}

		// The same addresses behind an arbitrary host name, through
		// CheckURL and DialContext; nothing is ever connected to.
		host := string(data)
		res := &fakeResolver{hosts: map[string][]netip.Addr{host: cands}}
		g := NewGuard(nil)
		g.Resolver = res
		var mu sync.Mutex
		var dialled []string
		g.dial = func(_ context.Context, _, address string) (net.Conn, error) {
			mu.Lock()
			dialled = append(dialled, address)
			mu.Unlock()
			return nil, errors.New("not dialling in a fuzz test")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = g.CheckURL(ctx, "http://"+host+"/")
		_, _ = g.DialContext(ctx, "tcp", net.JoinHostPort(host, "80"))
		_, _ = g.DialContext(ctx, "tcp", host)
		for _, d := range dialled {
			ap, err := netip.ParseAddrPort(d)
			if err != nil {
				t.Fatalf("dialled %q, not ip:port", d)
			}
			if specialPurpose(ap.Addr()) {
				t.Fatalf("host %q: dialled the special-purpose address %s", host, d)
			}
			if !strings.HasSuffix(d, ":80") {
				t.Fatalf("dialled %q, not port 80", d)
			}
		}
	})
}

// FuzzCheckReply: whatever a worker names as its reply subject, CheckReply
// never panics, and what it accepts is a literal subject inside the inbox
// of a listed worker: _INBOX.<worker>.<token>…, printable ASCII, no
// wildcard, no empty token, no '$' token, at most MaxReplyLen bytes.
func FuzzCheckReply(f *testing.F) {
	for _, s := range []string{"_INBOX.w.1", "$JS.API.STREAM.PURGE.X", "_INBOX.w.>", "_INBOX..x", "_INBOX.w", "throttler.control.x", "_INBOX.w.a\x7f", "_INBOX.v.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, reply string) {
		user, err := CheckReply(reply, []string{"w", "x-1"})
		if err != nil {
			if user != "" || !errors.Is(err, ErrReplyRefused) {
				t.Fatalf("refused %q with user %q and %v", reply, user, err)
			}
			return
		}
		if user != "w" && user != "x-1" {
			t.Fatalf("accepted %q for user %q, not a listed worker", reply, user)
		}
		if len(reply) > MaxReplyLen || !strings.HasPrefix(reply, "_INBOX."+user+".") {
			t.Fatalf("accepted %q outside %s's inbox", reply, user)
		}
		for _, tok := range strings.Split(reply, ".") {
			if tok == "" || tok[0] == '$' || strings.ContainsAny(tok, "*>") {
				t.Fatalf("accepted %q with token %q", reply, tok)
			}
		}
		for _, c := range []byte(reply) {
			if c <= ' ' || c >= 0x7f {
				t.Fatalf("accepted %q with byte %#x", reply, c)
			}
		}
	})
}
