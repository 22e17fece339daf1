package ingest

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/throttler/throttler/api"
)

// Why the listener terminates TLS itself rather than leaving it to
// http.Server.ServeTLS: net/http writes its own refusals of an HTTP/1.1
// request (rewrite.go) on the connection Accept returned, which under
// ServeTLS is the *tls.Conn: the refusal is encrypted before any wrapper
// of the socket sees it, and stays text/plain. A wrapper above TLS sees it
// in clear, but net/http serves HTTP/2 only on a *tls.Conn (conn.serve:
// `if tlsConn, ok := c.rwc.(*tls.Conn)` … `c.server.TLSNextProto[proto]`),
// and which protocol a connection speaks is known only after its
// handshake. So the handshake happens here, before Accept returns the
// connection: one that negotiated "h2" is handed to the server as the
// *tls.Conn itself (HTTP/2 as before; its refusals are frames), any other
// as a tlsConn, the *tls.Conn with the refusal rewrite of trackedConn,
// whose ConnectionState gives the request its TLS state (net/http sets
// Request.TLS from a connection that has one, the connectionStater of
// conn.serve).
//
// A slow or silent client must not hold Accept: each handshake runs in a
// goroutine of its own, bounded by HandshakeTimeout (net/http's own
// bound), and by the connection bounds, since the connection is counted
// from the moment it is accepted. Accept takes the connections whose
// handshake is done, in the order they finish.

// handshakes is the TLS side of a Listener.
type handshakes struct {
	// ctx is cancelled by Close: handshakes in progress end (the
	// handshake closes its connection) and none is handed over.
	ctx    context.Context
	cancel context.CancelFunc
	// config is ListenerConfig.TLS as the server serves it, set when the
	// accept loop starts.
	config *tls.Config
	ready  chan net.Conn // handshaken connections, to Accept
	errs   chan error    // errors of the socket's accept, to Accept
	done   chan struct{} // closed when the accept loop has ended
	err    error         // the error that ended it, read after done

	mu      sync.Mutex // guards started and closed
	started bool
	closed  bool
	wg      sync.WaitGroup // the accept loop and the handshakes
}

func (h *handshakes) init() {
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.ready, h.errs, h.done = make(chan net.Conn), make(chan error), make(chan struct{})
}

// close ends the handshakes in progress; Listener.Close then waits for
// them.
func (h *handshakes) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.cancel()
}

// acceptTLS returns the next connection whose TLS handshake is done; the
// first call starts the accept loop.
func (l *Listener) acceptTLS() (net.Conn, error) {
	h := &l.hs
	h.mu.Lock()
	switch {
	case h.closed && !h.started:
		h.mu.Unlock()
		return nil, net.ErrClosed
	case !h.started:
		h.started = true
		h.config = l.serverTLS()
		h.wg.Go(l.acceptLoop)
	}
	h.mu.Unlock()
	select {
	case c := <-h.ready:
		return c, nil
	case err := <-h.errs:
		return nil, err
	case <-h.done:
		return nil, h.err
	}
}

// serverTLS is the TLS config to handshake with: ListenerConfig.TLS, not
// offering "h2" when the server it is installed on serves no HTTP/2 (as
// ServeTLS offers what the server serves). Called from the server's first
// Accept, after Serve has set up its HTTP/2.
func (l *Listener) serverTLS() *tls.Config {
	srv := l.srv.Load()
	if srv == nil || !slices.Contains(l.cfg.TLS.NextProtos, "h2") {
		return l.cfg.TLS
	}
	if _, ok := srv.TLSNextProto["h2"]; ok {
		return l.cfg.TLS
	}
	c := l.cfg.TLS.Clone()
	c.NextProtos = slices.DeleteFunc(slices.Clone(c.NextProtos), func(p string) bool { return p == "h2" })
	return c
}

// acceptLoop accepts sockets within the bounds and starts a handshake on
// each, until the listener is closed. Its other errors go to Accept (the
// server retries the temporary ones).
func (l *Listener) acceptLoop() {
	h := &l.hs
	defer close(h.done)
	for {
		tc, err := l.acceptConn()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				h.err = err
				return
			}
			select {
			case h.errs <- err:
				continue
			case <-h.ctx.Done():
				h.err = err
				return
			}
		}
		h.wg.Go(func() { l.handshake(tc) })
	}
}

// handshake does tc's TLS handshake and hands the connection to Accept:
// the *tls.Conn for HTTP/2, a tlsConn for HTTP/1.
func (l *Listener) handshake(tc *trackedConn) {
	h := &l.hs
	if d := l.cfg.HandshakeTimeout; d > 0 {
		_ = tc.SetDeadline(time.Now().Add(d))
	}
	t := tls.Server(tc, h.config)
	if err := t.HandshakeContext(h.ctx); err != nil {
		l.handshakeFailed(tc, err)
		return
	}
	_ = tc.SetDeadline(time.Time{}) // the server sets its own from here on
	var c net.Conn = &tlsConn{Conn: t, tc: tc}
	if t.ConnectionState().NegotiatedProtocol == "h2" {
		c = t
	}
	select {
	case h.ready <- c:
	case <-h.ctx.Done():
		tc.Close()
	}
}

// handshakeFailed logs why a handshake failed (as net/http does) and
// closes the connection; plain HTTP sent to the TLS port is answered
// first with a problem naming the scheme.
func (l *Listener) handshakeFailed(tc *trackedConn, err error) {
	defer tc.Close()
	if l.hs.ctx.Err() != nil {
		return // the listener is closing
	}
	var re tls.RecordHeaderError
	if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
		l.cfg.Logger.Warn("TLS handshake refused", "remote", tc.RemoteAddr().String(), "err", "client sent an HTTP request to an HTTPS server")
		answerPlainHTTP(tc)
		return
	}
	l.cfg.Logger.Warn("TLS handshake refused", "remote", tc.RemoteAddr().String(), "err", err.Error())
}

// looksLikeHTTP reports whether the first five bytes of a connection are
// the start of a plain HTTP request: net/http's own test
// (tlsRecordHeaderLooksLikeHTTP), with the methods of this API it lacks.
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "PATCH", "DELET":
		return true
	}
	return false
}

// answerPlainHTTP answers plain HTTP on the TLS port with a problem
// naming the scheme, then closes gracefully (as answerBusy) so that the
// client reads the answer rather than a reset.
func answerPlainHTTP(tc *trackedConn) {
	_ = tc.SetDeadline(time.Now().Add(rejectTimeout))
	if _, err := tc.Conn.Write(plainOnTLSAnswer()); err != nil {
		return
	}
	if cw, ok := tc.Conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(tc.Conn, 1<<20))
}

// plainOnTLSAnswer is the answer to plain HTTP on the TLS port.
func plainOnTLSAnswer() []byte {
	return problemAnswer("HTTP/1.0", http.StatusBadRequest, api.Problem{Field: "scheme",
		Detail: "this port serves HTTPS: the request was sent as plain HTTP"})
}

// tlsConn is an HTTP/1 connection over TLS as the server sees it: the
// *tls.Conn (its ConnectionState gives requests their TLS state, its
// NetConn is the trackedConn), with the HTTP server's own refusals
// rewritten as problem+json before they are encrypted.
type tlsConn struct {
	*tls.Conn
	tc *trackedConn
}

func (c *tlsConn) Write(b []byte) (int, error) { return c.tc.rewrite(c.Conn, b) }
