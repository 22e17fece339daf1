package ingest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/api"
)

// budget bounds the bytes of request bodies being read at once, in all
// and per caller (API key, else client IP), so that one caller's stalled
// uploads cannot refuse the others. A nil budget has no bound. Safe for
// concurrent use.
type budget struct {
	max       int64
	perCaller int64 // 0: no bound per caller
	used      atomic.Int64

	mu      sync.Mutex // guards callers
	callers map[bodyCaller]int64
}

// bodyCaller is who holds a part of the budget: an API key's id, else a
// client IP (a struct rather than a joined string: no allocation).
type bodyCaller struct{ key, ip string }

// bodyCallerOf is the caller of r for the budget.
func bodyCallerOf(r *http.Request) bodyCaller {
	if id, ok := r.Context().Value(callerCtx{}).(string); ok {
		return bodyCaller{key: id}
	}
	return bodyCaller{ip: clientIP(r)}
}

// reservation is what reserve took, to hand to give exactly once.
type reservation struct {
	n   int64
	who bodyCaller
}

// budgetFull says which bound a reservation would go over.
type budgetFull int

const (
	budgetOK       budgetFull = iota
	budgetAll                 // max_body_inflight
	budgetOfCaller            // max_body_inflight_per_caller
)

func newBudget(max, perCaller int64) *budget {
	if max <= 0 {
		return nil
	}
	if perCaller <= 0 || perCaller > max {
		perCaller = 0
	}
	return &budget{max: max, perCaller: perCaller, callers: map[bodyCaller]int64{}}
}

// take reserves a body's bytes: its length, or limit when the length is
// unknown (-1). ok is false when that would go over a bound; release gives
// the bytes back.
func (b *budget) take(who bodyCaller, length, limit int64) (release func(), full budgetFull) {
	res, full := b.reserve(who, length, limit)
	if full != budgetOK {
		return nil, full
	}
	var once sync.Once
	return func() { once.Do(func() { b.give(res) }) }, budgetOK
}

// reserve is take without a closure (the submit path calls it for every
// job): it returns the reservation, to hand to give exactly once. The
// caller's share is checked first, so that a caller over it is told so
// rather than that the server is full.
func (b *budget) reserve(who bodyCaller, length, limit int64) (reservation, budgetFull) {
	n := length
	if n < 0 {
		n = limit
	}
	if b == nil || n == 0 {
		return reservation{}, budgetOK
	}
	if b.perCaller > 0 {
		b.mu.Lock()
		held := b.callers[who]
		if held+n > b.perCaller {
			b.mu.Unlock()
			return reservation{}, budgetOfCaller
		}
		if !b.reserveAll(n) {
			b.mu.Unlock()
			return reservation{}, budgetAll
		}
		b.callers[who] = held + n
		b.mu.Unlock()
		return reservation{n: n, who: who}, budgetOK
	}
	if !b.reserveAll(n) {
		return reservation{}, budgetAll
	}
	return reservation{n: n}, budgetOK
}

// reserveAll takes n bytes of the whole budget if they fit.
func (b *budget) reserveAll(n int64) bool {
	for {
		used := b.used.Load()
		if used+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// give returns what reserve took.
func (b *budget) give(res reservation) {
	if b == nil || res.n == 0 {
		return
	}
	if b.perCaller > 0 {
		b.mu.Lock()
		if left := b.callers[res.who] - res.n; left > 0 {
			b.callers[res.who] = left
		} else {
			delete(b.callers, res.who)
		}
		b.mu.Unlock()
	}
	b.used.Add(-res.n)
}

// heldBy is the bytes who holds now (0 without a bound per caller).
func (b *budget) heldBy(who bodyCaller) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.callers[who]
}

// fullProblem is the refusal of a body the budget has no room for: 429
// naming the caller's share, or 503 naming the whole budget; the
// connection is closed either way (the body is not read).
func (b *budget) fullProblem(w http.ResponseWriter, full budgetFull) (api.Problem, string) {
	w.Header().Set("Connection", "close")
	if full == budgetOfCaller {
		return api.Problem{Type: ProblemOverloaded, Status: http.StatusTooManyRequests, Field: "max_body_inflight_per_caller",
			Detail: fmt.Sprintf("your request bodies being read at once would go over your share of %d bytes (http.max_body_inflight_per_caller); retry when one is done", b.perCaller)}, "body_inflight_caller_full"
	}
	return api.Problem{Type: ProblemOverloaded, Status: http.StatusServiceUnavailable, Field: "max_body_inflight",
		Detail: "too many request bodies are being read at once; retry"}, "body_inflight_full"
}

// ListenerConfig configures LimitListener.
type ListenerConfig struct {
	// MaxConnections bounds the connections open at once (at least 1).
	MaxConnections int
	// TLS, when set, is the server's TLS config: a refused connection is
	// answered over TLS too (the caller wraps the limited listener in
	// tls.NewListener).
	TLS    *tls.Config
	Logger *slog.Logger
}

// LimitListener bounds the connections open at once. A connection over
// the bound is not left waiting in the accept queue: it gets an HTTP 503
// problem (field max_connections, Retry-After: 1) and is closed, while
// the listener goes on accepting.
func LimitListener(ln net.Listener, cfg ListenerConfig) net.Listener {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &limitListener{Listener: ln, cfg: cfg, rejecting: make(chan struct{}, maxRejecting)}
}

// maxRejecting bounds the goroutines answering refused connections; past
// it a refused connection is closed without an answer.
const maxRejecting = 64

// rejectTimeout bounds the time spent answering one refused connection.
const rejectTimeout = time.Second

type limitListener struct {
	net.Listener
	cfg       ListenerConfig
	open      atomic.Int64
	rejecting chan struct{}

	answering sync.WaitGroup

	mu      sync.Mutex
	refused int64
	lastLog time.Time
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= int64(l.cfg.MaxConnections) {
			return &countedConn{Conn: c, open: &l.open}, nil
		}
		l.open.Add(-1)
		l.refuse(c)
	}
}

// refuse answers c with a 503 in a goroutine of its own (bounded).
func (l *limitListener) refuse(c net.Conn) {
	l.mu.Lock()
	l.refused++
	if now := time.Now(); now.Sub(l.lastLog) >= 10*time.Second {
		l.cfg.Logger.Warn("connection refused: max_connections reached", "max_connections", l.cfg.MaxConnections,
			"refused_since_last_log", l.refused, "ip", remoteIP(c))
		l.lastLog, l.refused = now, 0
	}
	l.mu.Unlock()
	select {
	case l.rejecting <- struct{}{}:
	default:
		c.Close()
		return
	}
	l.answering.Go(func() {
		defer func() { <-l.rejecting }()
		answerBusy(c, l.cfg.TLS)
	})
}

// Close stops accepting and waits for the refused connections still being
// answered (at most rejectTimeout).
func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.answering.Wait()
	return err
}

// answerBusy writes a 503 problem on a connection the server will not
// serve, then closes it gracefully: the client reads the answer instead of
// a reset.
func answerBusy(c net.Conn, cfg *tls.Config) {
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
		Field: "max_connections", Detail: "the server has its max_connections open; retry", RetryAfterSeconds: 1})
	fmt.Fprintf(conn, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: %s\r\nCache-Control: no-store\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		problemContentType, len(body), body)
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	// Read what the client sent until it closes (or the deadline): closing
	// with unread bytes would reset the connection and lose the answer.
	_, _ = io.Copy(io.Discard, in)
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// countedConn gives its place back when closed.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.open.Add(-1) })
	return err
}

// CloseWrite passes a half-close through, so that the server can let a
// client read an early answer (413) before the connection closes.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
