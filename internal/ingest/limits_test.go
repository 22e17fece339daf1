package ingest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// readCounter fails the test if the handler reads the body.
type readCounter struct{ n int }

func (r *readCounter) Read([]byte) (int, error) { r.n++; return 0, io.EOF }

// TestEarly413: a Content-Length over the lane's max_body is refused before
// a byte of the body is read (it used to be read up to max_body first).
func TestEarly413(t *testing.T) {
	f := newFixture(t, nil) // max_body 1 KiB
	body := &readCounter{}
	r := httptest.NewRequest("POST", "/v1/lanes/demo/jobs", body)
	r.Host = "localhost"
	r.ContentLength = 10 << 20
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, r)
	if p := readProblem(t, rec); rec.Code != 413 || p.Field != "body" || body.n != 0 {
		t.Fatalf("%d %+v after %d reads", rec.Code, p, body.n)
	}
	if f.pub.n.Load() != 0 {
		t.Fatal("a refused job was published")
	}
}

// serve runs h on a loopback listener (optionally wrapped) with srv's
// settings; it stops when the test ends.
func serve(t *testing.T, h http.Handler, wrap func(net.Listener) net.Listener, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	if srv == nil {
		srv = &http.Server{}
	}
	srv.Handler = h
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readAnswer reads one HTTP response from c within d.
func readAnswer(t *testing.T, c net.Conn, d time.Duration) (*http.Response, problemBody) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	var p problemBody
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		if err := json.Unmarshal(raw, &p); err != nil {
			t.Fatalf("problem %q: %v", raw, err)
		}
	}
	return resp, p
}

// TestEarly413OverTheWire: the client sends only the headers of a 100 KiB
// body and gets its 413 at once.
func TestEarly413OverTheWire(t *testing.T) {
	f := newFixture(t, nil)
	addr := serve(t, f.h, nil, nil)
	c := dial(t, addr)
	fmt.Fprintf(c, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n", 100<<10)
	start := time.Now()
	resp, p := readAnswer(t, c, 5*time.Second)
	if resp.StatusCode != 413 || p.Field != "body" || time.Since(start) > 2*time.Second {
		t.Fatalf("%d %+v after %v", resp.StatusCode, p, time.Since(start))
	}
}

// TestBodyInflightCap reproduces stalled bodies piling up in memory (100
// stalled 1 MiB bodies took RSS from 31 to 145 MB): with max_body_inflight
// of two bodies, a third stalled upload is answered 503 + Retry-After at
// once, and the budget comes back when a body is done.
func TestBodyInflightCap(t *testing.T) {
	const maxBody = 1 << 10
	f := newFixture(t, func(c *Config) { c.MaxBodyInflight = 2 * maxBody })
	addr := serve(t, f.h, nil, nil)
	start := func(length string) net.Conn {
		c := dial(t, addr)
		te := "Content-Length: " + length
		if length == "" {
			te = "Transfer-Encoding: chunked"
		}
		fmt.Fprintf(c, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\n%s\r\n\r\n", te)
		return c
	}
	a := start(fmt.Sprint(maxBody))
	b := start("") // unknown length: counts as max_body
	deadline := time.Now().Add(5 * time.Second)
	for f.h.bodies.used.Load() != 2*maxBody {
		if time.Now().After(deadline) {
			t.Fatalf("bodies in flight: %d bytes", f.h.bodies.used.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := start("10")
	resp, p := readAnswer(t, c, 5*time.Second)
	if resp.StatusCode != 503 || p.Field != "max_body_inflight" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("third body: %d %+v Retry-After %q", resp.StatusCode, p, resp.Header.Get("Retry-After"))
	}
	// Finish a's body: its bytes come back, and a new body fits.
	a.Write([]byte(strings.Repeat("x", maxBody)))
	if resp, _ := readAnswer(t, a, 5*time.Second); resp.StatusCode != 202 {
		t.Fatalf("a: %d %s", resp.StatusCode, f.logs)
	}
	d := start("2")
	d.Write([]byte("ok"))
	if resp, _ := readAnswer(t, d, 5*time.Second); resp.StatusCode != 202 {
		t.Fatalf("d: %d", resp.StatusCode)
	}
	b.Close()
	deadline = time.Now().Add(5 * time.Second)
	for f.h.bodies.used.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after every body ended, %d bytes are still counted", f.h.bodies.used.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if f.pub.n.Load() != 2 {
		t.Fatalf("%d jobs published, want 2", f.pub.n.Load())
	}
}

// TestConnectionCap: with max_connections 2 and two connections open, a
// third gets an HTTP 503 problem with Retry-After and is closed, not left
// waiting; once one closes, a new connection is served.
func TestConnectionCap(t *testing.T) {
	f := newFixture(t, nil)
	var lim *Listener
	addr := serve(t, f.h, func(ln net.Listener) net.Listener {
		lim = LimitListener(ln, ListenerConfig{MaxConnections: 2})
		return lim
	}, nil)
	a, b := dial(t, addr), dial(t, addr)
	deadline := time.Now().Add(5 * time.Second)
	for lim.openConns() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open", lim.openConns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := dial(t, addr)
	fmt.Fprint(c, "GET /v1/lanes HTTP/1.1\r\nHost: localhost\r\n\r\n")
	resp, p := readAnswer(t, c, 5*time.Second)
	if resp.StatusCode != 503 || p.Field != "max_connections" || p.Type != ProblemOverloaded || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("third connection: %d %+v %v", resp.StatusCode, p, resp.Header)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("third connection not closed: %d %v", n, err)
	}
	// The first two are served.
	fmt.Fprint(a, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if resp, _ := readAnswer(t, a, 5*time.Second); resp.StatusCode != 200 {
		t.Fatalf("a: %d %s", resp.StatusCode, f.logs)
	}
	b.Close()
	deadline = time.Now().Add(5 * time.Second)
	for lim.openConns() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open after one closed", lim.openConns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	d := dial(t, addr)
	fmt.Fprint(d, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if resp, _ := readAnswer(t, d, 5*time.Second); resp.StatusCode != 200 {
		t.Fatalf("d: %d", resp.StatusCode)
	}
}

// TestSlowBodyIsCut reproduces a client that sends its body one byte
// every 2.5 s, which used to keep the request open for as long as it liked:
// the server's read_timeout (here 3 s) cuts it off with a 408.
func TestSlowBodyIsCut(t *testing.T) {
	f := newFixture(t, nil)
	addr := serve(t, f.h, nil, &http.Server{ReadHeaderTimeout: time.Second, ReadTimeout: 3 * time.Second})
	c := dial(t, addr)
	start := time.Now()
	fmt.Fprint(c, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(2500 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	resp, p := readAnswer(t, c, 10*time.Second)
	took := time.Since(start)
	if resp.StatusCode != http.StatusRequestTimeout || p.Field != "body" || p.Type != ProblemRequestTimeout {
		t.Fatalf("%d %+v", resp.StatusCode, p)
	}
	if took < 2900*time.Millisecond || took > 6*time.Second {
		t.Fatalf("cut after %v, want about read_timeout (3s)", took)
	}
	if f.pub.n.Load() != 0 {
		t.Fatal("a cut-off job was published")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open after the timeout")
	}
}
