package ingest

import (
	"bufio"
	"container/list"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/api"
)

// ListenerConfig configures LimitListener.
type ListenerConfig struct {
	// MaxConnections bounds the connections open at once (at least 1).
	MaxConnections int
	// MaxPerIP bounds the connections of one client IP (the socket
	// peer); zero: no bound per IP.
	MaxPerIP int
	// IdleUnderLoad closes a keep-alive connection idle this long while
	// three quarters of MaxConnections are open; zero: only the server's
	// own idle timeout applies.
	IdleUnderLoad time.Duration
	// TrustedProxies are peers exempt from MaxPerIP: a reverse proxy
	// carries many clients on its connections (SetTrustedProxies changes
	// them).
	TrustedProxies []netip.Prefix
	// TLS, when set, is the server's TLS config: the listener terminates
	// TLS itself (tlslisten.go), so serve it with http.Server.Serve, not
	// ServeTLS. Its NextProtos say what ALPN offers ("h2", "http/1.1").
	// A refused connection is answered over TLS too.
	TLS *tls.Config
	// HandshakeTimeout bounds a TLS handshake (what net/http applies:
	// the least of the server's read-header, read and write timeouts);
	// zero: no bound.
	HandshakeTimeout time.Duration
	Logger           *slog.Logger
}

// Listener bounds the connections open at once, in all and per client
// IP, so that no one client can hold the server. Idle keep-alive
// connections give way first: a new connection over a bound closes the
// longest-idle connection (of its IP, for the bound per IP) instead of
// being refused, and while the server nears MaxConnections a connection
// idle for IdleUnderLoad is closed. Only when none is idle is a new
// connection refused: it is not left waiting in the accept queue but gets
// an HTTP 503 problem (field max_connections or max_connections_per_ip,
// Retry-After: 1) and is closed, while the listener goes on accepting.
//
// The listener learns from the HTTP server which connections are idle and
// which are handling a request: Install it on the server. Without that no
// connection is taken for idle (the bounds only refuse), and nothing is
// rewritten.
//
// Once installed, its connections answer the HTTP server's own refusals
// (a request it cannot parse) with problem+json instead of text/plain
// (rewrite.go), over TLS too: with ListenerConfig.TLS the listener does
// the handshake and hands the server HTTP/2 connections as *tls.Conn and
// HTTP/1 ones with the rewrite above TLS (tlslisten.go). Safe for
// concurrent use.
type Listener struct {
	net.Listener
	cfg       ListenerConfig
	trusted   atomic.Pointer[[]netip.Prefix]
	rejecting chan struct{}
	answering sync.WaitGroup

	// installed is set by Install: the listener then knows when a
	// connection is handling a request.
	installed atomic.Bool
	srv       atomic.Pointer[http.Server] // the server Install hooked into

	mu   sync.Mutex // guards what follows and every trackedConn's state
	open int
	ips  map[netip.Addr]*ipConns
	idle list.List // of *trackedConn, longest idle first

	refused int64
	lastLog time.Time

	hs handshakes // under TLS
	// busyTLS is cfg.TLS offering only HTTP/1.1: a refused connection is
	// answered in HTTP/1.1 whatever the client offers.
	busyTLS *tls.Config
}

// ipConns are one client IP's connections.
type ipConns struct {
	open int
	idle list.List // of *trackedConn, longest idle first
}

// LimitListener wraps ln with the bounds of cfg.
func LimitListener(ln net.Listener, cfg ListenerConfig) *Listener {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Listener{Listener: ln, cfg: cfg, rejecting: make(chan struct{}, maxRejecting), ips: map[netip.Addr]*ipConns{}}
	l.hs.init()
	if cfg.TLS != nil {
		l.busyTLS = cfg.TLS.Clone()
		l.busyTLS.NextProtos = []string{"http/1.1"}
	}
	l.SetTrustedProxies(cfg.TrustedProxies)
	return l
}

// SetTrustedProxies replaces the peers exempt from the bound per IP (a
// reload of callers.trusted_proxies); connections open stay as they are.
func (l *Listener) SetTrustedProxies(p []netip.Prefix) {
	p = append([]netip.Prefix(nil), p...)
	l.trusted.Store(&p)
}

// maxRejecting bounds the goroutines answering refused connections; past
// it a refused connection is closed without an answer.
const maxRejecting = 64

// rejectTimeout bounds the time spent answering one refused connection.
const rejectTimeout = time.Second

// Refusals of a connection, by the bound it would go over.
const (
	fieldMaxConnections = "max_connections"
	fieldMaxPerIP       = "max_connections_per_ip"
)

// Accept returns the next connection within the bounds, closing idle ones
// to make room, and answers those over them itself. Under TLS the
// connection returned has done its handshake (tlslisten.go).
func (l *Listener) Accept() (net.Conn, error) {
	if l.cfg.TLS != nil {
		return l.acceptTLS()
	}
	tc, err := l.acceptConn()
	if err != nil {
		return nil, err // not a nil *trackedConn in a net.Conn
	}
	return tc, nil
}

// acceptConn returns the next socket within the bounds.
func (l *Listener) acceptConn() (*trackedConn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := newTrackedConn(l, c, peerAddr(c))
		refused, victims := l.admit(tc, time.Now())
		// Closing the socket ends the server's wait for the next request
		// on it; the server then closes the trackedConn, which no longer
		// counts. Closing an idle connection is what the server's own
		// idle timeout does: a client whose request crossed the close
		// retries it (RFC 9112, section 9.3.1).
		for _, v := range victims {
			v.Conn.Close()
		}
		if refused == "" {
			return tc, nil
		}
		l.refuse(c, refused, tc.ip)
	}
}

// admit counts tc in if the bounds allow, closing idle connections to make
// room; it returns the bound that refuses tc ("" when admitted) and the
// idle connections to close.
func (l *Listener) admit(tc *trackedConn, now time.Time) (refused string, victims []*trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	victims = l.reapLocked(now)
	ipc := l.ips[tc.share]
	if !tc.exempt && l.cfg.MaxPerIP > 0 && ipc != nil && ipc.open >= l.cfg.MaxPerIP {
		e := ipc.idle.Front()
		if e == nil {
			return fieldMaxPerIP, victims
		}
		v := e.Value.(*trackedConn)
		l.uncountLocked(v)
		victims = append(victims, v)
	}
	if l.open >= l.cfg.MaxConnections {
		e := l.idle.Front()
		if e == nil {
			return fieldMaxConnections, victims
		}
		v := e.Value.(*trackedConn)
		l.uncountLocked(v)
		victims = append(victims, v)
	}
	if ipc = l.ips[tc.share]; ipc == nil {
		ipc = &ipConns{}
		l.ips[tc.share] = ipc
	}
	ipc.open++
	l.open++
	tc.counted = true
	return "", victims
}

// underLoadLocked reports whether three quarters of max_connections are
// open.
func (l *Listener) underLoadLocked() bool { return 4*l.open >= 3*l.cfg.MaxConnections }

// reapLocked takes out, under load, the connections idle IdleUnderLoad or
// longer, and returns them to close.
func (l *Listener) reapLocked(now time.Time) []*trackedConn {
	if l.cfg.IdleUnderLoad <= 0 || !l.underLoadLocked() {
		return nil
	}
	var out []*trackedConn
	for e := l.idle.Front(); e != nil; e = l.idle.Front() {
		v := e.Value.(*trackedConn)
		if now.Sub(v.idleSince) < l.cfg.IdleUnderLoad {
			break
		}
		l.uncountLocked(v)
		out = append(out, v)
	}
	return out
}

// uncountLocked gives tc's places back (once).
func (l *Listener) uncountLocked(tc *trackedConn) {
	if !tc.counted {
		return
	}
	tc.counted = false
	l.unidleLocked(tc)
	l.open--
	if ipc := l.ips[tc.share]; ipc != nil {
		if ipc.open--; ipc.open <= 0 {
			delete(l.ips, tc.share)
		}
	}
}

// unidleLocked takes tc off the idle lists.
func (l *Listener) unidleLocked(tc *trackedConn) {
	if tc.idleElem == nil {
		return
	}
	l.idle.Remove(tc.idleElem)
	if ipc := l.ips[tc.share]; ipc != nil {
		ipc.idle.Remove(tc.ipElem)
	}
	tc.idleElem, tc.ipElem = nil, nil
}

// Install hooks the listener into srv, before srv serves it: ConnState
// tells it which connections are idle, ConnContext and a wrapper of
// srv.Handler which are handling a request (hooks srv already has still
// run).
func (l *Listener) Install(srv *http.Server) {
	state, connCtx, next := srv.ConnState, srv.ConnContext, srv.Handler
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if tc := l.tracked(c); tc != nil {
			l.setState(tc, s, time.Now())
		}
		if state != nil {
			state(c, s)
		}
	}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if tc := l.tracked(c); tc != nil {
			ctx = context.WithValue(ctx, trackedConnCtx{}, tc)
		}
		if connCtx != nil {
			ctx = connCtx(ctx, c)
		}
		return ctx
	}
	if next == nil {
		next = http.DefaultServeMux
	}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// From here until the server takes the connection for idle, what
		// is written on it is this request's answer.
		if tc, ok := r.Context().Value(trackedConnCtx{}).(*trackedConn); ok {
			tc.handling.Store(true)
		}
		next.ServeHTTP(w, r)
	})
	l.srv.Store(srv)
	l.installed.Store(true)
}

type trackedConnCtx struct{}

// tracked is the listener's connection under c: the server hands back the
// connection Accept returned, or under TLS the tls.Conn over it.
func (l *Listener) tracked(c net.Conn) *trackedConn {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = nc.NetConn()
	}
	if tc, ok := c.(*trackedConn); ok && tc.l == l {
		return tc
	}
	return nil
}

// setState is ConnState at now.
func (l *Listener) setState(tc *trackedConn, state http.ConnState, now time.Time) {
	if state == http.StateIdle {
		tc.handling.Store(false) // the answer is written
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case state == http.StateIdle && tc.counted && tc.idleElem == nil:
		tc.idleSince = now
		tc.idleElem = l.idle.PushBack(tc)
		tc.ipElem = l.ips[tc.share].idle.PushBack(tc)
	case state != http.StateIdle:
		l.unidleLocked(tc)
	}
}

// exempt reports whether ip is a trusted proxy's.
func (l *Listener) exempt(ip netip.Addr) bool {
	for _, p := range *l.trusted.Load() {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// openConns is the number of connections counted open.
func (l *Listener) openConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// refuse answers c with a 503 in a goroutine of its own (bounded).
func (l *Listener) refuse(c net.Conn, field string, ip netip.Addr) {
	l.mu.Lock()
	l.refused++
	if now := time.Now(); now.Sub(l.lastLog) >= 10*time.Second {
		l.cfg.Logger.Warn("connection refused: "+field+" reached", "max_connections", l.cfg.MaxConnections,
			"max_connections_per_ip", l.cfg.MaxPerIP, "refused_since_last_log", l.refused, "ip", ip.String())
		l.lastLog, l.refused = now, 0
	}
	l.mu.Unlock()
	select {
	case l.rejecting <- struct{}{}:
	default:
		c.Close()
		return
	}
	detail := "the server has its max_connections open and none idle; retry"
	if field == fieldMaxPerIP {
		detail = fmt.Sprintf("this client IP has its max_connections_per_ip (%d) open and none idle; retry", l.cfg.MaxPerIP)
	}
	l.answering.Go(func() {
		defer func() { <-l.rejecting }()
		answerBusy(c, l.busyTLS, field, detail)
	})
}

// Close stops accepting and waits for the refused connections still being
// answered (at most rejectTimeout); under TLS it ends the handshakes in
// progress and waits for them.
func (l *Listener) Close() error {
	l.hs.close()
	err := l.Listener.Close()
	l.hs.wg.Wait()
	l.answering.Wait()
	return err
}

// answerBusy writes a 503 problem on a connection the server will not
// serve, then closes it gracefully: the client reads the answer instead of
// a reset.
func answerBusy(c net.Conn, cfg *tls.Config, field, detail string) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(rejectTimeout))
	conn := c
	if cfg != nil {
		t := tls.Server(c, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), rejectTimeout)
		err := t.HandshakeContext(ctx)
		cancel()
		if err != nil {
			return
		}
		conn = t
	}
	// The answer goes after the client's request: one that came before it
	// was written is an unsolicited response to an HTTP client (Go's
	// transport drops the connection instead of reading it), which a slow
	// client saw under load.
	in := bufio.NewReader(io.LimitReader(conn, 1<<20))
	if _, err := http.ReadRequest(in); err != nil {
		return
	}
	body, _ := json.Marshal(api.Problem{Type: ProblemOverloaded, Title: "Service Unavailable", Status: 503,
		Field: field, Detail: detail, RetryAfterSeconds: 1})
	fmt.Fprintf(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\nCache-Control: no-store\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		problemContentType, len(body), body)
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	// Read what the client sent until it closes (or the deadline): closing
	// with unread bytes would reset the connection and lose the answer.
	_, _ = io.Copy(io.Discard, in)
}

func newTrackedConn(l *Listener, c net.Conn, ip netip.Addr) *trackedConn {
	tc := &trackedConn{Conn: c, l: l, ip: ip, share: ip, exempt: l.exempt(ip)}
	if ip.Is6() {
		tc.share = netip.PrefixFrom(ip, 64).Masked().Addr()
	}
	return tc
}

// peerAddr is the socket peer's IP (IPv4-mapped IPv6 as IPv4); the zero
// Addr when the peer is not an IP (a Unix socket), which then shares one
// count.
func peerAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// trackedConn is one counted connection; it gives its places back when
// closed.
type trackedConn struct {
	net.Conn
	l  *Listener
	ip netip.Addr
	// share is what the bound per IP counts by: the IP, or for IPv6 its
	// /64 (one subscriber's network: an attacker with a /64 has 2^64
	// addresses, a client one of them).
	share  netip.Addr
	exempt bool
	// handling is set while the server handles a request on the
	// connection: its bytes are never taken for a refusal of the server.
	handling atomic.Bool

	// guarded by l.mu
	counted          bool
	idleSince        time.Time
	idleElem, ipElem *list.Element
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.uncountLocked(c)
	c.l.mu.Unlock()
	return err
}

// Write rewrites the HTTP server's own plain-text refusals as problem+json
// (rewriteServerError); everything else passes through unchanged. Only
// while no request is being handled: a handler's answer, however it is
// cut into writes (a large body goes past the server's buffer in one
// Write), is never touched.
//
// Under TLS the bytes written here are TLS records: the rewrite happens on
// the connection above TLS (tlsConn) instead.
func (c *trackedConn) Write(b []byte) (int, error) {
	if c.l.cfg.TLS != nil {
		return c.Conn.Write(b)
	}
	return c.rewrite(c.Conn, b)
}

// rewrite writes b to w, or the problem+json that replaces b when b is a
// refusal of the HTTP server on this connection.
func (c *trackedConn) rewrite(w io.Writer, b []byte) (int, error) {
	if !c.l.installed.Load() || c.handling.Load() {
		return w.Write(b)
	}
	if p, ok := rewriteServerError(b); ok {
		if _, err := w.Write(p); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return w.Write(b)
}

// CloseWrite passes a half-close through, so that the server can let a
// client read an early answer (413) before the connection closes.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
