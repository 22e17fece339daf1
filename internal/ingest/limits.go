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

// budget bounds the bytes of request bodies being read at once. A nil
// budget has no bound. Safe for concurrent use.
type budget struct {
	max  int64
	used atomic.Int64
}

func newBudget(max int64) *budget {
	if max <= 0 {
		return nil
	}
	return &budget{max: max}
}

// take reserves a body's bytes: its length, or limit when the length is
// unknown (-1). ok is false when that would go over the bound; release
// gives the bytes back.
func (b *budget) take(length, limit int64) (release func(), ok bool) {
	n, ok := b.reserve(length, limit)
	if !ok {
		return nil, false
	}
	var once sync.Once
	return func() { once.Do(func() { b.give(n) }) }, true
}

// reserve is take without a closure (the submit path calls it for every
// job): it returns the bytes reserved, to hand to give exactly once.
func (b *budget) reserve(length, limit int64) (int64, bool) {
	n := length
	if n < 0 {
		n = limit
	}
	if b == nil || n == 0 {
		return 0, true
	}
	for {
		used := b.used.Load()
		if used+n > b.max {
			return 0, false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return n, true
		}
	}
}

// give returns bytes that reserve took.
func (b *budget) give(n int64) {
	if b != nil && n != 0 {
		b.used.Add(-n)
	}
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
