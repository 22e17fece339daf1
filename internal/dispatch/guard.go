package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"code.dny.dev/ssrf"
)

// ErrForbiddenAddress is the sentinel of every address the SSRF Guard
// refuses. The concrete error is an *AddressError naming the address; test
// for it with errors.Is(err, ErrForbiddenAddress). An HTTP delivery refused
// for this reason is Dead: retrying cannot help.
var ErrForbiddenAddress = errors.New("dispatch: forbidden address")

// AddressError is the error of a refused address. It matches
// ErrForbiddenAddress under errors.Is. Its message has no package prefix:
// it is always wrapped with the operation (dial, check url).
type AddressError struct {
	// Host is the name that was resolved, or "" when the target was
	// given as a literal IP.
	Host string
	// Addr is the refused address.
	Addr netip.Addr
	// Reason names the refused range, e.g. "private" or "loopback".
	Reason string
}

// Error implements error.
func (e *AddressError) Error() string {
	if e.Host != "" {
		return fmt.Sprintf("forbidden address %s (%s) for host %q", e.Addr, e.Reason, e.Host)
	}
	return fmt.Sprintf("forbidden address %s (%s)", e.Addr, e.Reason)
}

// Is reports whether target is ErrForbiddenAddress.
func (e *AddressError) Is(target error) bool { return target == ErrForbiddenAddress }

// Resolver resolves host names to IP addresses. *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Guard refuses outbound connections to internal addresses (SSRF
// protection), unless the address is inside one of the allowed prefixes:
// every range of the IANA IPv4 and IPv6 special-purpose registries (from
// package code.dny.dev/ssrf: loopback, private, link-local with the
// 169.254.169.254 metadata service, CGNAT, documentation, benchmarking,
// multicast, 6to4 and its relay, Teredo, …), every IPv6 address outside
// global unicast (2000::/3) but NAT64, Azure's platform address
// 168.63.129.16, and the IPv4-mapped and NAT64 (64:ff9b::/96) forms of
// refused IPv4 addresses.
//
// The check happens at dial time on the very address being connected, so a
// host name that resolves to a public address when the config is checked
// and to an internal one later (DNS rebinding) is still refused, and a
// refused address is never connected to. A proxy would defeat the check
// (the dial would go to the proxy), so a transport using DialContext must
// not use one; NewHTTP's transport does not.
//
// The zero Guard refuses every internal address and allows no exception; a
// nil *Guard allows everything. A Guard is safe for concurrent use; do not
// change its fields after first use.
type Guard struct {
	// Resolver resolves host names at dial time and in CheckURL; nil
	// means net.DefaultResolver. Tests set it to map names to chosen
	// addresses.
	Resolver Resolver

	allow []netip.Prefix
	// dial connects to one checked ip:port; nil means a net.Dialer with
	// Control set to the guard's check. Tests replace it to prove that a
	// refused address is never dialled.
	dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// NewGuard returns a Guard that refuses internal addresses except those
// inside allow (e.g. 127.0.0.0/8 for a target on the same host). Invalid
// prefixes in allow are ignored; validate them when parsing the config.
func NewGuard(allow []netip.Prefix) *Guard {
	g := &Guard{}
	for _, p := range allow {
		if p.IsValid() {
			g.allow = append(g.allow, p.Masked())
		}
	}
	return g
}

// forbidden lists the refused ranges with the reason reported in errors, in
// the order they are tried. It is read-only after initialisation. The
// special-purpose ranges come from the IANA registries as package ssrf
// publishes them (its IPv4 list, and its IPv6 list inside global unicast);
// every IPv6 address outside global unicast (2000::/3) but NAT64 is refused
// as well (see refusal): the ranges of that space listed here only give the
// error a better reason.
var forbidden = buildForbidden()

type refusedRange struct {
	prefix netip.Prefix
	reason string
}

// rangeNames gives the reason of each range of ssrf's lists; a range the
// library adds later without a name here is reported as "special-purpose
// <prefix>" (TestGuardNamesEveryRange lists it).
var rangeNames = map[string]string{
	"0.0.0.0/8":         "this network",
	"10.0.0.0/8":        "private",
	"100.64.0.0/10":     "carrier-grade NAT",
	"127.0.0.0/8":       "loopback",
	"169.254.0.0/16":    "link-local",
	"172.16.0.0/12":     "private",
	"192.0.0.0/24":      "IETF protocol assignments",
	"192.0.2.0/24":      "documentation",
	"192.31.196.0/24":   "AS112",
	"192.52.193.0/24":   "AMT",
	"192.88.99.0/24":    "6to4 relay anycast",
	"192.168.0.0/16":    "private",
	"192.175.48.0/24":   "AS112",
	"198.18.0.0/15":     "benchmarking",
	"198.51.100.0/24":   "documentation",
	"203.0.113.0/24":    "documentation",
	"240.0.0.0/4":       "reserved",
	"224.0.0.0/4":       "multicast",
	"2001::/23":         "IETF protocol assignments",
	"2001:db8::/32":     "documentation",
	"2002::/16":         "6to4",
	"2620:4f:8000::/48": "AS112",
	"3fff::/20":         "documentation",
}

func buildForbidden() []refusedRange {
	named := func(p netip.Prefix) refusedRange {
		if r, ok := rangeNames[p.String()]; ok {
			return refusedRange{p, r}
		}
		return refusedRange{p, "special-purpose " + p.String()}
	}
	out := []refusedRange{
		// IPv6 outside global unicast: refused anyway, named for the
		// error. ::/128 and ::1/128 before ::/96, which holds them.
		{netip.MustParsePrefix("::/128"), "unspecified"},
		{netip.MustParsePrefix("::1/128"), "loopback"},
		{netip.MustParsePrefix("::/96"), "IPv4-compatible"},
		{netip.MustParsePrefix("100::/64"), "discard-only"},
		{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64"},
		{netip.MustParsePrefix("fc00::/7"), "private"},
		{netip.MustParsePrefix("fe80::/10"), "link-local"},
		{netip.MustParsePrefix("fec0::/10"), "site-local"},
		{netip.MustParsePrefix("ff00::/8"), "multicast"},
		// Not in the IANA registries: Azure's platform address (DNS,
		// DHCP, health probes and the WireServer, which hands a VM its
		// configuration and certificates), reachable from every Azure VM
		// like a metadata service.
		{netip.MustParsePrefix("168.63.129.16/32"), "Azure platform address"},
		// Teredo sits inside ssrf's 2001::/23: named first for the error.
		{netip.MustParsePrefix("2001::/32"), "Teredo"},
	}
	for _, p := range ssrf.IPv4DeniedPrefixes {
		out = append(out, named(p))
	}
	for _, p := range ssrf.IPv6DeniedPrefixes {
		out = append(out, named(p))
	}
	return out
}

var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4      = netip.MustParsePrefix("2002::/16")
)

// Check returns an *AddressError (matching ErrForbiddenAddress) if addr is
// refused, nil if it may be connected to. A nil Guard allows everything.
func (g *Guard) Check(addr netip.Addr) error {
	if g == nil {
		return nil
	}
	if reason := g.refusal(addr); reason != "" {
		return &AddressError{Addr: addr, Reason: reason}
	}
	return nil
}

// refusal returns why addr is refused, or "" if it is allowed.
func (g *Guard) refusal(addr netip.Addr) string {
	if !addr.IsValid() {
		return "invalid"
	}
	addr = addr.WithZone("")
	plain := addr.Unmap()
	for _, p := range g.allow {
		if p.Contains(addr) || p.Contains(plain) {
			return ""
		}
	}
	// Addresses that embed an IPv4 address route to it: judge that one
	// first, for the more telling reason. 6to4 is refused below even when
	// its IPv4 address is public.
	if embedded, ok := embeddedIPv4(plain); ok {
		if r := g.refusal(embedded); r != "" {
			return r + " (embedded in " + plain.String() + ")"
		}
	}
	for _, f := range forbidden {
		if f.prefix.Contains(plain) {
			return f.reason
		}
	}
	// Outside global unicast, IPv6 has nothing a target should be on; NAT64
	// (64:ff9b::/96) was judged on its IPv4 address above.
	if plain.Is6() && !ssrf.IPv6GlobalUnicast.Contains(plain) && !nat64Prefix.Contains(plain) {
		return "not global unicast"
	}
	return ""
}

// embeddedIPv4 returns the IPv4 address inside a NAT64 (64:ff9b::/96) or
// 6to4 (2002::/16) address.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case !a.Is6():
		return netip.Addr{}, false
	case nat64Prefix.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixTo4.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// control is a net.Dialer Control hook: it runs after the socket is made
// and before connect, with the numeric address being connected.
func (g *Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable dial address %q", ErrForbiddenAddress, address)
	}
	return g.Check(ap.Addr())
}

// DialContext connects to address (host:port) like net.Dialer.DialContext,
// but resolves the host itself, drops every refused address, and connects
// only to the checked ones (in resolver order, sharing the context's
// deadline between them). The connecting dialer's Control hook checks the
// address once more just before connect. If every address is refused, the
// error wraps the first *AddressError (naming the address) and nothing is
// dialled. A nil Guard dials without checks.
func (g *Guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if g == nil {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("dial %s %s: %w", network, address, err)
	}
	addrs, err := g.resolve(ctx, network, host)
	if err != nil {
		return nil, fmt.Errorf("dial %s %s: %w", network, address, err)
	}
	var allowed []netip.Addr
	var refused error
	for _, a := range addrs {
		if reason := g.refusal(a); reason != "" {
			if refused == nil {
				refused = &AddressError{Host: hostIfName(host), Addr: a, Reason: reason}
			}
			continue
		}
		allowed = append(allowed, a)
	}
	if len(allowed) == 0 {
		if refused == nil {
			return nil, fmt.Errorf("dial %s %s: no address for host", network, address)
		}
		return nil, fmt.Errorf("dial %s %s: %w", network, address, refused)
	}
	dial := g.dial
	if dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second, Control: g.control}
		dial = d.DialContext
	}
	var firstErr error
	for i, a := range allowed {
		actx, cancel := partialDeadline(ctx, len(allowed)-i)
		conn, err := dial(actx, network, net.JoinHostPort(a.String(), port))
		cancel()
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// partialDeadline gives one of n remaining dial attempts its share of the
// context's deadline (at least 2 s, as net.Dialer does), so that one
// black-holed address does not use up the whole timeout.
func partialDeadline(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || n <= 1 {
		return ctx, func() {}
	}
	share := time.Until(deadline) / time.Duration(n)
	if share < 2*time.Second {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, share)
}

// hostIfName returns host unless it is a literal IP.
func hostIfName(host string) string {
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	return host
}

// resolve returns host's addresses; a literal IP is returned as is.
func (g *Guard) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	ipNet := "ip"
	switch network {
	case "tcp4", "udp4":
		ipNet = "ip4"
	case "tcp6", "udp6":
		ipNet = "ip6"
	}
	var r Resolver = net.DefaultResolver
	if g.Resolver != nil {
		r = g.Resolver
	}
	return r.LookupNetIP(ctx, ipNet, host)
}

// CheckURL checks the host of an http(s) URL at config time, to fail early
// on a target that the guard would refuse at every delivery: a literal IP
// such as http://10.0.0.1/, or a name that resolves only to refused
// addresses. A name that does not resolve now is not an error (DNS may be
// down at start); DialContext still checks every delivery. A nil Guard only
// parses the URL.
func (g *Guard) CheckURL(ctx context.Context, rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("dispatch: check url: %w", err)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("dispatch: check url %q: no host", rawURL)
	}
	if g == nil {
		return nil
	}
	addrs, err := g.resolve(ctx, "tcp", host)
	if err != nil || len(addrs) == 0 {
		return nil
	}
	var refused error
	for _, a := range addrs {
		reason := g.refusal(a)
		if reason == "" {
			return nil
		}
		if refused == nil {
			refused = &AddressError{Host: hostIfName(host), Addr: a, Reason: reason}
		}
	}
	return fmt.Errorf("dispatch: check url %s://%s: %w", u.Scheme, u.Host, refused)
}
