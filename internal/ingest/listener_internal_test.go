package ingest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestListenerBounds steps the listener's decisions at fixed times t0…t9:
// which connection is admitted, which bound refuses it, which idle
// connections are closed in its place.
func TestListenerBounds(t *testing.T) {
	var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		at      time.Time
		conn    string // "a1": a connection of IP a; a new name is admitted
		idle    bool   // conn goes idle instead
		refused string // the bound that refuses conn
		closed  string // the idle connections closed for it, in order
	}
	ips := map[byte]netip.Addr{'a': netip.MustParseAddr("10.0.0.1"), 'b': netip.MustParseAddr("10.0.0.2"),
		'c': netip.MustParseAddr("10.0.0.3"), 'p': netip.MustParseAddr("192.168.1.1"),
		'x': netip.MustParseAddr("2001:db8:0:1::1"), 'y': netip.MustParseAddr("2001:db8:0:1:ffff::2"), 'z': netip.MustParseAddr("2001:db8:0:2::1")}
	for _, tc := range []struct {
		name  string
		cfg   ListenerConfig
		steps []step
	}{
		{"IdleGivesWay", ListenerConfig{MaxConnections: 4, MaxPerIP: 2}, []step{
			{at: at(0), conn: "a1"},
			{at: at(0), conn: "a2"},
			{at: at(0), conn: "a3", refused: fieldMaxPerIP}, // a1 and a2 busy
			{at: at(1), conn: "a2", idle: true},
			{at: at(2), conn: "a1", idle: true},
			{at: at(3), conn: "a4", closed: "a2"}, // a's longest idle
			{at: at(3), conn: "b1"},
			{at: at(3), conn: "b2"},
			{at: at(4), conn: "c1", closed: "a1"}, // every slot taken: the longest idle of any IP
			{at: at(5), conn: "c2", refused: fieldMaxConnections},
			{at: at(6), conn: "b2", idle: true},
			{at: at(7), conn: "c2", closed: "b2"},
		}},
		{"IPv6SharesBy64", ListenerConfig{MaxConnections: 8, MaxPerIP: 2}, []step{
			{at: at(0), conn: "x1"},
			{at: at(0), conn: "y1"}, // another address of the same /64
			{at: at(0), conn: "x2", refused: fieldMaxPerIP},
			{at: at(0), conn: "z1"}, // another /64
		}},
		{"TrustedProxyHasNoShare", ListenerConfig{MaxConnections: 4, MaxPerIP: 1, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")}}, []step{
			{at: at(0), conn: "p1"},
			{at: at(0), conn: "p2"},
			{at: at(0), conn: "p3"},
			{at: at(0), conn: "a1"},
			{at: at(0), conn: "p4", refused: fieldMaxConnections},
		}},
		{"IdleTimeoutUnderLoad", ListenerConfig{MaxConnections: 8, IdleUnderLoad: 5 * time.Second}, []step{
			{at: at(0), conn: "a1"},
			{at: at(0), conn: "a2"},
			{at: at(0), conn: "a3"},
			{at: at(0), conn: "a4"},
			{at: at(0), conn: "a5"},
			{at: at(0), conn: "a1", idle: true},
			{at: at(1), conn: "a2", idle: true},
			{at: at(5), conn: "b1"}, // 6 of 8 open from now on: under load
			{at: at(5), conn: "b2", closed: "a1"},
			{at: at(6), conn: "b3", closed: "a2"},
			{at: at(9), conn: "b4"},
		}},
		{"NoShorterTimeoutBelowLoad", ListenerConfig{MaxConnections: 100, IdleUnderLoad: 5 * time.Second}, []step{
			{at: at(0), conn: "a1"},
			{at: at(0), conn: "a1", idle: true},
			{at: at(9), conn: "a2"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := LimitListener(nil, tc.cfg)
			conns := map[string]*trackedConn{}
			for i, s := range tc.steps {
				if s.idle {
					l.setState(conns[s.conn], http.StateIdle, s.at)
					continue
				}
				c := newTrackedConn(l, nil, ips[s.conn[0]])
				refused, victims := l.admit(c, s.at)
				var closed []string
				for _, v := range victims {
					for name, o := range conns {
						if o == v {
							closed = append(closed, name)
							delete(conns, name)
						}
					}
				}
				if refused != s.refused || strings.Join(closed, ",") != s.closed {
					t.Fatalf("step %d (%s at t%d): refused %q closed %q, want %q %q", i, s.conn, int(s.at.Sub(t0).Seconds()), refused, closed, s.refused, s.closed)
				}
				if refused == "" {
					conns[s.conn] = c
				}
			}
			// Every connection closed gives its places back exactly once.
			for _, c := range conns {
				l.mu.Lock()
				l.uncountLocked(c)
				l.uncountLocked(c)
				l.mu.Unlock()
			}
			if l.openConns() != 0 || len(l.ips) != 0 || l.idle.Len() != 0 {
				t.Fatalf("after every close: %d open, %d IPs, %d idle", l.openConns(), len(l.ips), l.idle.Len())
			}
		})
	}
}

// serverRefusals are net/http's own refusals, byte for byte as its
// server writes them.
var serverRefusals = []string{
	"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request",
	"HTTP/1.1 400 Bad Request: invalid header name\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: invalid header name",
	"HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header",
	"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large",
	"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nUnsupported transfer encoding",
	"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505 HTTP Version Not Supported: unsupported protocol version",
	"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: Sun, 06 Dec 2026 00:00:00 GMT\r\nContent-Length: 0\r\n\r\n",
}

// TestRewriteServerError: each of net/http's refusals becomes a whole
// problem+json answer with its status; anything else passes unchanged.
func TestRewriteServerError(t *testing.T) {
	for _, in := range serverRefusals {
		out, ok := rewriteServerError([]byte(in))
		if !ok {
			t.Fatalf("not rewritten: %q", in)
		}
		checkRewrite(t, []byte(in), out)
	}
	for _, in := range []string{
		"",
		"\x16\x03\x01\x00\xa5", // a TLS record
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Sun, 06 Dec 2026 00:00:00 GMT\r\nContent-Length: 3\r\n\r\nok\n",
		// A handler's answer carries a Date and a length.
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nDate: Sun, 06 Dec 2026 00:00:00 GMT\r\nContent-Length: 15\r\n\r\n400 Bad Request",
		// The body is not the status line; the status text is not the code's.
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request and more",
		"HTTP/1.1 400 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Not Found",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n200 OK",
		// Half of a refusal (one Write is always the whole of it).
		"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n",
		"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: x\r\nContent-Length: 0\r\n\r\n",
	} {
		if out, ok := rewriteServerError([]byte(in)); ok {
			t.Errorf("rewritten: %q\nto %q", in, out)
		}
	}
}

// checkRewrite checks that out, the rewrite of in, is one whole HTTP
// answer: the status of in, problem+json with that status and a bounded
// detail, and the connection closed.
func checkRewrite(t *testing.T, in, out []byte) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(out))), nil)
	if err != nil {
		t.Fatalf("rewrite of %q does not parse: %v\n%q", in, err, out)
	}
	defer resp.Body.Close()
	var p problemBody
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("rewrite of %q: body: %v", in, err)
	}
	if !strings.HasPrefix(string(in), resp.Proto+" ") || resp.StatusCode < 400 || resp.StatusCode > 599 ||
		resp.Header.Get("Content-Type") != problemContentType || !resp.Close ||
		p.Status != resp.StatusCode || p.Type != ProblemMalformedRequest || p.Detail == "" || len(p.Detail) > maxRewriteDetail {
		t.Fatalf("rewrite of %q: %q", in, out)
	}
	if _, again := rewriteServerError(out); again {
		t.Fatalf("a rewrite is rewritten again: %q", out)
	}
}

// FuzzRewriteServerError: whatever the server writes, a rewrite is a whole
// problem+json answer with the status it replaces.
func FuzzRewriteServerError(f *testing.F) {
	for _, s := range serverRefusals {
		f.Add([]byte(s))
	}
	f.Add([]byte("HTTP/1.1 400 Bad Request: \xff\xfe\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: \xff\xfe"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, ok := rewriteServerError(in)
		if !ok {
			return
		}
		if status, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(string(in), "HTTP/1.1 "), "HTTP/1.0 "), " "); len(status) != 3 {
			t.Fatalf("rewrote %q, which has no status", in)
		}
		checkRewrite(t, in, out)
	})
}

// TestBodyBudgetPerCaller: a caller holds at most its share of the body
// budget, checked before the whole budget, and every byte comes back.
func TestBodyBudgetPerCaller(t *testing.T) {
	b := newBudget(100, 40)
	a, k, ip := bodyCaller{key: "a"}, bodyCaller{key: "k"}, bodyCaller{ip: "10.0.0.1"}
	var held []reservation
	for i, s := range []struct {
		who           bodyCaller
		length, limit int64
		want          budgetFull
	}{
		{a, 30, 0, budgetOK},
		{a, 20, 0, budgetOfCaller}, // 50 > a's 40
		{a, -1, 10, budgetOK},      // unknown length: the limit counts
		{k, 40, 0, budgetOK},
		{ip, 40, 0, budgetAll}, // 120 > 100, within ip's share
		{ip, 20, 0, budgetOK},
		{k, 1, 0, budgetOfCaller},
	} {
		res, full := b.reserve(s.who, s.length, s.limit)
		if full != s.want {
			t.Fatalf("step %d: %+v got %d, want %d", i, s, full, s.want)
		}
		if full == budgetOK {
			held = append(held, res)
		}
	}
	if b.heldBy(a) != 40 || b.used.Load() != 100 {
		t.Fatalf("a holds %d, all %d", b.heldBy(a), b.used.Load())
	}
	for _, r := range held {
		b.give(r)
	}
	if b.used.Load() != 0 || len(b.callers) != 0 {
		t.Fatalf("after every give: %d bytes, %d callers", b.used.Load(), len(b.callers))
	}
}

// TestHandlerAnswerIsNeverRewritten: a handler's body that holds a
// refusal of net/http byte for byte (a client may choose a body the API
// echoes: a target's answer, a dead letter's payload) reaches the client
// unchanged, however the server cuts it into writes. A body past the
// server's 4 KiB buffer goes to the connection in one Write from some
// offset; the test moves the refusal across every offset near it.
func TestHandlerAnswerIsNeverRewritten(t *testing.T) {
	refusal := "HTTP/1.1 400 Bad Request: " + strings.Repeat("x", 2100) + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: " + strings.Repeat("x", 2100)
	if _, ok := rewriteServerError([]byte(refusal)); !ok {
		t.Fatal("the body under test is not a refusal net/http could write")
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("pad"))
		body := strings.Repeat("p", n) + refusal
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write([]byte(body)) // not WriteString: that one is copied through the buffer
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(ln, ListenerConfig{MaxConnections: 4})
	l.Install(srv)
	done := make(chan struct{})
	go func() { srv.Serve(l); close(done) }()
	defer func() { srv.Close(); <-done }()
	c := dial(t, ln.Addr().String())
	r := bufio.NewReader(c)
	for pad := 3800; pad <= 4096; pad++ {
		fmt.Fprintf(c, "GET /?pad=%d HTTP/1.1\r\nHost: localhost\r\n\r\n", pad)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("pad %d: %v", pad, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(got) != strings.Repeat("p", pad)+refusal {
			t.Fatalf("pad %d: %d, %d bytes (%v), want the handler's %d", pad, resp.StatusCode, len(got), err, pad+len(refusal))
		}
	}
}

// BenchmarkBodyBudget: one reserve and give of the body budget per
// submission, all callers in one budget (perCaller 0) or each caller its
// share; parallel, 64 callers.
//
//	go test -run '^$' -bench 'BodyBudget|ConnWrite' -benchmem ./internal/ingest/
func BenchmarkBodyBudget(b *testing.B) {
	for _, perCaller := range []int64{0, 16 << 20} {
		b.Run("perCaller="+strconv.FormatInt(perCaller, 10), func(b *testing.B) {
			bud := newBudget(64<<20, perCaller)
			callers := make([]bodyCaller, 64)
			for i := range callers {
				callers[i] = bodyCaller{key: "k" + strconv.Itoa(i)}
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					res, full := bud.reserve(callers[i%len(callers)], 1024, 1<<20)
					if full != budgetOK {
						b.Fatal("budget full")
					}
					bud.give(res)
					i++
				}
			})
		})
	}
}

// discardConn is a net.Conn whose writes go nowhere.
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkConnWrite: what the refusal check adds to a write of an
// answer (4 KiB, the server's buffer) on a listener's connection.
func BenchmarkConnWrite(b *testing.B) {
	l := LimitListener(nil, ListenerConfig{MaxConnections: 1})
	l.installed.Store(true)
	c := newTrackedConn(l, discardConn{}, netip.MustParseAddr("127.0.0.1"))
	answer := []byte("HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nDate: Sun, 06 Dec 2026 00:00:00 GMT\r\nContent-Length: 4000\r\n\r\n" + strings.Repeat("x", 4000))
	b.ReportAllocs()
	b.SetBytes(int64(len(answer)))
	for b.Loop() {
		c.Write(answer)
	}
}
