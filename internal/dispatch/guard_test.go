package dispatch

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"code.dny.dev/ssrf"
)

// fakeResolver maps host names to chosen addresses; other names do not
// resolve. It counts lookups.
type fakeResolver struct {
	hosts   map[string][]netip.Addr
	lookups atomic.Int32
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	if a, ok := r.hosts[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// dialRecorder replaces a Guard's connecting dialer: it records every
// address that would have been connected to, and connects for real.
type dialRecorder struct {
	mu    sync.Mutex
	dials []string
}

func (d *dialRecorder) install(g *Guard) {
	inner := &net.Dialer{Control: g.control}
	g.dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		d.mu.Lock()
		d.dials = append(d.dials, address)
		d.mu.Unlock()
		return inner.DialContext(ctx, network, address)
	}
}

func (d *dialRecorder) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dials...)
}

func TestGuardCheck(t *testing.T) {
	open := NewGuard(nil)
	local := NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16")})
	special := NewGuard([]netip.Prefix{netip.MustParsePrefix("168.63.129.16/32"), netip.MustParsePrefix("2002::/16")})
	steps := []struct {
		addr      string
		guard     *Guard
		forbidden bool
		reason    string
	}{
		{"8.8.8.8", open, false, ""},
		{"2606:4700:4700::1111", open, false, ""},
		{"127.0.0.1", open, true, "loopback"},
		{"127.1.2.3", open, true, "loopback"},
		{"::1", open, true, "loopback"},
		{"10.0.0.1", open, true, "private"},
		{"172.16.5.4", open, true, "private"},
		{"172.32.0.1", open, false, ""},
		{"192.168.1.1", open, true, "private"},
		{"fd00::1", open, true, "private"},
		{"169.254.169.254", open, true, "link-local"},
		{"fe80::1", open, true, "link-local"},
		{"fe80::1%eth0", open, true, "link-local"},
		{"0.0.0.0", open, true, "this network"},
		{"::", open, true, "unspecified"},
		{"224.0.0.1", open, true, "multicast"},
		{"ff02::1", open, true, "multicast"},
		{"100.64.0.1", open, true, "carrier-grade NAT"},
		{"100.127.255.255", open, true, "carrier-grade NAT"},
		{"100.128.0.1", open, false, ""},
		{"255.255.255.255", open, true, "reserved"},
		{"::ffff:10.0.0.1", open, true, "private"},
		{"::ffff:169.254.169.254", open, true, "link-local"},
		{"::ffff:127.0.0.1", open, true, "loopback"},
		{"::ffff:8.8.8.8", open, false, ""},
		{"64:ff9b::a9fe:a9fe", open, true, "link-local (embedded in 64:ff9b::a9fe:a9fe)"}, // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", open, false, ""},
		{"2002:a00:1::", open, true, "private (embedded in 2002:a00:1::)"}, // 6to4 of 10.0.0.1
		// IANA special-purpose ranges (through package ssrf) and Azure.
		{"64:ff9b:1::1", open, true, "local-use NAT64"},
		{"64:ff9b:1::808:808", open, true, "local-use NAT64"},
		{"2001::1", open, true, "Teredo"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", open, true, "Teredo"},
		{"2001:2::1", open, true, "IETF protocol assignments"},
		{"2001:db8::1", open, true, "documentation"},
		{"3fff::1", open, true, "documentation"},
		{"2620:4f:8000::1", open, true, "AS112"},
		{"192.88.99.1", open, true, "6to4 relay anycast"},
		{"::ffff:192.88.99.1", open, true, "6to4 relay anycast"},
		{"2002:c058:6301::", open, true, "6to4 relay anycast (embedded in 2002:c058:6301::)"},
		{"2002:808:808::", open, true, "6to4"}, // 6to4 of a public address
		{"64:ff9b::c058:6301", open, true, "6to4 relay anycast (embedded in 64:ff9b::c058:6301)"},
		{"192.0.2.1", open, true, "documentation"},
		{"198.51.100.7", open, true, "documentation"},
		{"203.0.113.9", open, true, "documentation"},
		{"192.31.196.1", open, true, "AS112"},
		{"192.52.193.1", open, true, "AMT"},
		{"192.175.48.1", open, true, "AS112"},
		{"168.63.129.16", open, true, "Azure platform address"},
		{"::ffff:168.63.129.16", open, true, "Azure platform address"},
		{"64:ff9b::a83f:8110", open, true, "Azure platform address (embedded in 64:ff9b::a83f:8110)"},
		{"168.63.129.17", open, false, ""},
		{"::ffff:0:a00:1", open, true, "not global unicast"}, // IPv4-translated (SIIT)
		{"4000::1", open, true, "not global unicast"},
		{"2a00:1450:4001::200e", open, false, ""},
		{"168.63.129.16", special, false, ""},
		{"2002:808:808::", special, false, ""},
		{"2002:a00:1::", special, false, ""}, // an allowed prefix allows all it holds
		{"127.0.0.1", local, false, ""},
		{"::ffff:127.0.0.1", local, false, ""},
		{"10.1.2.3", local, false, ""},
		{"10.2.0.1", local, true, "private"},
		{"::1", local, true, "loopback"},
		{"169.254.169.254", local, true, "link-local"},
	}
	for _, s := range steps {
		name := s.addr
		switch s.guard {
		case local:
			name += " with allowlist"
		case special:
			name += " with special allowlist"
		}
		t.Run(name, func(t *testing.T) {
			err := s.guard.Check(netip.MustParseAddr(s.addr))
			if got := errors.Is(err, ErrForbiddenAddress); got != s.forbidden {
				t.Fatalf("Check(%s) = %v, want forbidden=%v", s.addr, err, s.forbidden)
			}
			var ae *AddressError
			if s.forbidden && (!errors.As(err, &ae) || ae.Reason != s.reason || ae.Addr != netip.MustParseAddr(s.addr)) {
				t.Errorf("Check(%s) = %#v, want reason %q", s.addr, err, s.reason)
			}
		})
	}
	var none *Guard
	if err := none.Check(netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Errorf("nil guard refused: %v", err)
	}
}

// TestGuardNamesEveryRange keeps the reasons in step with package ssrf: a
// range it lists has a name here, and no name is left for a range it
// dropped.
func TestGuardNamesEveryRange(t *testing.T) {
	listed := map[string]bool{}
	for _, p := range append(slices.Clone(ssrf.IPv4DeniedPrefixes), ssrf.IPv6DeniedPrefixes...) {
		listed[p.String()] = true
		if _, ok := rangeNames[p.String()]; !ok {
			t.Errorf("ssrf lists %s: give it a name in rangeNames", p)
		}
	}
	for p := range rangeNames {
		if !listed[p] {
			t.Errorf("rangeNames names %s, which ssrf no longer lists", p)
		}
	}
}

// TestGuardRefusesEveryListedRange probes the first and last address of
// every range in package ssrf's lists (and the IPv6 space outside global
// unicast): the guard refuses each, as the library's own guardian does.
func TestGuardRefusesEveryListedRange(t *testing.T) {
	g := NewGuard(nil)
	lib := ssrf.New(ssrf.WithAnyPort(), ssrf.WithAnyNetwork())
	prefixes := append(slices.Clone(ssrf.IPv4DeniedPrefixes), ssrf.IPv6DeniedPrefixes...)
	prefixes = append(prefixes, netip.MustParsePrefix("::/3"), netip.MustParsePrefix("4000::/2"), netip.MustParsePrefix("8000::/1"))
	for _, p := range prefixes {
		for _, a := range []netip.Addr{p.Masked().Addr(), lastAddr(p)} {
			if lib.SafeAddr(a) == nil {
				t.Errorf("%s (in %s): the library allows it; the probe is wrong", a, p)
			}
			if err := g.Check(a); !errors.Is(err, ErrForbiddenAddress) {
				t.Errorf("%s (in %s): Check = %v, want refused", a, p, err)
			}
		}
	}
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func TestGuardCheckURL(t *testing.T) {
	res := &fakeResolver{hosts: map[string][]netip.Addr{
		"internal.test": addrs("10.9.8.7", "fd00::7"),
		"public.test":   addrs("93.184.216.34"),
		"mixed.test":    addrs("10.9.8.7", "93.184.216.34"),
	}}
	g := NewGuard(nil)
	g.Resolver = res
	steps := []struct {
		url     string
		refused bool
		mention string
	}{
		{"http://10.0.0.1/", true, "10.0.0.1"},
		{"http://169.254.169.254/latest/meta-data", true, "169.254.169.254"},
		{"http://[::1]:8080/x", true, "::1"},
		{"http://[::ffff:a00:1]/", true, "::ffff:10.0.0.1"},
		{"https://internal.test/hook", true, `10.9.8.7 (private) for host "internal.test"`},
		{"https://public.test/hook", false, ""},
		{"https://mixed.test/hook", false, ""},        // a dial uses the public address only
		{"https://unresolvable.test/hook", false, ""}, // DNS may be down at start
		{"http://8.8.8.8/", false, ""},
	}
	for _, s := range steps {
		t.Run(s.url, func(t *testing.T) {
			err := g.CheckURL(context.Background(), s.url)
			if errors.Is(err, ErrForbiddenAddress) != s.refused {
				t.Fatalf("CheckURL = %v, want refused=%v", err, s.refused)
			}
			if s.refused && !strings.Contains(err.Error(), s.mention) {
				t.Errorf("err = %q, want it to mention %q", err, s.mention)
			}
			if !s.refused && err != nil {
				t.Errorf("err = %v", err)
			}
		})
	}
	if err := g.CheckURL(context.Background(), "http:///nohost"); err == nil {
		t.Error("no error for a URL without host")
	}
}

// TestGuardRefusesBeforeConnecting proves that a refused address is never
// dialled: the dial hook sees nothing, and the answer comes at once, not
// after a connect timeout.
func TestGuardRefusesBeforeConnecting(t *testing.T) {
	for _, raw := range []string{"http://10.0.0.1/", "http://169.254.169.254/latest/meta-data"} {
		t.Run(raw, func(t *testing.T) {
			g := NewGuard(nil)
			var rec dialRecorder
			rec.install(g)
			h := newHTTP(t, HTTPConfig{URL: raw, Timeout: 5 * time.Second}, g)
			res := h.Deliver(context.Background(), testJob())
			if res.Verdict != Dead || !errors.Is(res.Err, ErrForbiddenAddress) {
				t.Fatalf("verdict %v err %v, want dead with ErrForbiddenAddress", res.Verdict, res.Err)
			}
			t.Logf("err: %v", res.Err)
			u, _ := url.Parse(raw)
			if !strings.Contains(res.Err.Error(), u.Hostname()) {
				t.Errorf("err = %q, want it to name %s", res.Err, u.Hostname())
			}
			if d := rec.seen(); len(d) != 0 {
				t.Errorf("dialled %v", d)
			}
			if res.Took > 500*time.Millisecond {
				t.Errorf("Took = %v: looks like a connect attempt", res.Took)
			}
		})
	}
}

// TestGuardControlHook checks the last line of defence: a net.Dialer whose
// Control hook is the guard's refuses in the hook, which runs after the
// socket is made and before connect(2).
func TestGuardControlHook(t *testing.T) {
	g := NewGuard(nil)
	var saw atomic.Value
	d := &net.Dialer{
		Timeout: 5 * time.Second,
		Control: func(network, address string, c syscall.RawConn) error {
			saw.Store(address)
			return g.control(network, address, c)
		},
	}
	start := time.Now()
	_, err := d.DialContext(context.Background(), "tcp", "169.254.169.254:80")
	if !errors.Is(err, ErrForbiddenAddress) || !strings.Contains(err.Error(), "169.254.169.254") {
		t.Fatalf("err = %v, want ErrForbiddenAddress naming the address", err)
	}
	if saw.Load() != "169.254.169.254:80" {
		t.Errorf("control saw %v", saw.Load())
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("took %v", took)
	}
	if err := g.control("tcp", "not-an-address", nil); !errors.Is(err, ErrForbiddenAddress) {
		t.Errorf("unparsable address: %v", err)
	}
}

// TestGuardDNSRebinding: a name that resolves to a refused address at dial
// time is refused, whatever it resolved to before; with the range allowed,
// the same delivery goes through.
func TestGuardDNSRebinding(t *testing.T) {
	var hits atomic.Int32
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	target := "http://rebind.test:" + itoa(int64(port)) + "/hook"
	res := &fakeResolver{hosts: map[string][]netip.Addr{"rebind.test": addrs("93.184.216.34")}}

	g := NewGuard(nil)
	g.Resolver = res
	if err := g.CheckURL(context.Background(), target); err != nil {
		t.Fatalf("CheckURL at start: %v", err)
	}
	res.hosts["rebind.test"] = addrs("127.0.0.1") // the rebinding
	var rec dialRecorder
	rec.install(g)
	r := newHTTP(t, HTTPConfig{URL: target}, g).Deliver(context.Background(), testJob())
	if r.Verdict != Dead || !errors.Is(r.Err, ErrForbiddenAddress) {
		t.Fatalf("verdict %v err %v, want dead with ErrForbiddenAddress", r.Verdict, r.Err)
	}
	if !strings.Contains(r.Err.Error(), `127.0.0.1 (loopback) for host "rebind.test"`) {
		t.Errorf("err = %q", r.Err)
	}
	if d := rec.seen(); len(d) != 0 || hits.Load() != 0 {
		t.Errorf("dialled %v, server saw %d requests", d, hits.Load())
	}

	allow := NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	allow.Resolver = res
	res.hosts["rebind.test"] = addrs("10.0.0.1", "127.0.0.1") // refused one first
	var rec2 dialRecorder
	rec2.install(allow)
	r = newHTTP(t, HTTPConfig{URL: target}, allow).Deliver(context.Background(), testJob())
	if r.Verdict != Done {
		t.Fatalf("allowed: verdict %v err %v", r.Verdict, r.Err)
	}
	if d := rec2.seen(); len(d) != 1 || !strings.HasPrefix(d[0], "127.0.0.1:") {
		t.Errorf("dialled %v, want only 127.0.0.1", d)
	}
}

// TestGuardLoopbackTarget: an httptest server on 127.0.0.1 is reachable
// only through a guard that allows 127.0.0.0/8.
func TestGuardLoopbackTarget(t *testing.T) {
	var hits atomic.Int32
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })

	allowed := newHTTP(t, HTTPConfig{URL: srv.URL}, NewGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}))
	if res := allowed.Deliver(context.Background(), testJob()); res.Verdict != Done {
		t.Fatalf("allowed: verdict %v err %v", res.Verdict, res.Err)
	}
	refused := newHTTP(t, HTTPConfig{URL: srv.URL}, NewGuard(nil))
	res := refused.Deliver(context.Background(), testJob())
	if res.Verdict != Dead || !errors.Is(res.Err, ErrForbiddenAddress) || !strings.Contains(res.Err.Error(), "127.0.0.1") {
		t.Fatalf("refused: verdict %v err %v", res.Verdict, res.Err)
	}
	if n := hits.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1", n)
	}
}

func TestGuardDialContextErrors(t *testing.T) {
	g := NewGuard(nil)
	g.Resolver = &fakeResolver{}
	if _, err := g.DialContext(context.Background(), "tcp", "no-port"); err == nil {
		t.Error("no error for an address without port")
	}
	_, err := g.DialContext(context.Background(), "tcp", "nowhere.test:80")
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || errors.Is(err, ErrForbiddenAddress) {
		t.Errorf("unresolvable: err = %v, want the DNS error", err)
	}
}
