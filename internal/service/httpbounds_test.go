package service_test

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
)

// peer is one client connection from a chosen loopback address (the whole
// of 127.0.0.0/8 is this host), so that a test has many client IPs.
type peer struct {
	net.Conn
	r *bufio.Reader
}

func dialFrom(t *testing.T, ip, addr string) *peer {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return &peer{Conn: c, r: bufio.NewReader(c)}
}

// answer is one response read from a peer.
type answer struct {
	status      int
	contentType string
	problem     map[string]any
	body        string
}

// read reads the next response within d.
func (p *peer) read(d time.Duration) (answer, error) {
	p.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(p.r, nil)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: string(raw)}
	if strings.HasPrefix(a.contentType, "application/problem+json") {
		_ = json.Unmarshal(raw, &a.problem)
	}
	return a, nil
}

// get asks for /healthz on the connection and returns the status (0 when
// the connection gave no answer).
func (p *peer) get() int {
	fmt.Fprint(p, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	a, err := p.read(5 * time.Second)
	if err != nil {
		return 0
	}
	return a.status
}

// upload starts a submission whose body never comes: the connection is
// busy, not idle.
func (p *peer) upload(path, secret string, length int) {
	auth := ""
	if secret != "" {
		auth = "Authorization: Bearer " + secret + "\r\n"
	}
	fmt.Fprintf(p, "POST %s HTTP/1.1\r\nHost: localhost\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n[", path, auth, length)
}

// closedByServer reports whether the server has closed the connection.
func (p *peer) closedByServer() bool {
	p.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := p.r.Peek(1)
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// TestIdleConnectionsGiveWay: idle keep-alive connections cannot hold the
// server. With max_connections 8 and max_connections_per_ip 4: one IP's
// four idle connections do not stop its fifth (its longest idle is closed
// instead), nor, with every slot held by idle connections, another IP's;
// busy connections are never closed, and only when none is idle is a new
// one refused, 503 naming the bound (per IP, then in all).
func TestIdleConnectionsGiveWay(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.HTTP.MaxConnections = 8
	cfg.HTTP.MaxConnectionsPerIP = 4
	svc, _ := startLogged(t, cfg)
	addr := svc.Addr()

	idle := func(ip string, n int) []*peer {
		var out []*peer
		for range n {
			p := dialFrom(t, ip, addr)
			if s := p.get(); s != 200 {
				t.Fatalf("%s: connection %d answered %d", ip, len(out), s)
			}
			out = append(out, p)
		}
		return out
	}
	// A connection is taken for idle once the server is done with its
	// answer, a moment after the client has read it: a new connection
	// that came first is refused and tries again.
	servedFrom := func(ip string) *peer {
		t.Helper()
		var p *peer
		waitFor(t, 5*time.Second, "a connection from "+ip+" served", func() bool {
			p = dialFrom(t, ip, addr)
			return p.get() == 200
		})
		return p
	}

	// The longest idle is the one the server saw idle first: usually the
	// first one answered, but the server takes a connection for idle a
	// moment after its answer is read, so on a loaded machine a later one
	// can come first. Exactly one closes each time.
	closed := map[int]bool{}
	oneMoreClosed := func(what string, ps []*peer) {
		t.Helper()
		waitFor(t, 5*time.Second, what, func() bool {
			for i, p := range ps {
				if !closed[i] && p.closedByServer() {
					closed[i] = true
					return true
				}
			}
			return false
		})
		for i, p := range ps {
			if !closed[i] && p.closedByServer() {
				t.Fatalf("%s: 127.0.0.2's connection %d closed too", what, i)
			}
		}
	}
	a := idle("127.0.0.2", 4)
	servedFrom("127.0.0.2")
	oneMoreClosed("127.0.0.2's longest-idle connection closed", a)
	idle("127.0.0.3", 4) // now every slot holds an idle connection
	servedFrom("127.0.0.4")
	// 127.0.0.2's three left have been idle longer than 127.0.0.3's.
	oneMoreClosed("the longest-idle connection closed for another IP", a)

	// Busy connections (uploads in progress) from one IP take its share;
	// its next connection is refused, other IPs are still served.
	for range 4 {
		dialFrom(t, "127.0.0.5", addr).upload("/v1/lanes/demo/jobs", "", 100)
	}
	over := dialFrom(t, "127.0.0.5", addr)
	fmt.Fprint(over, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if ans, err := over.read(5 * time.Second); err != nil || ans.status != 503 || ans.problem["field"] != "max_connections_per_ip" ||
		!strings.Contains(fmt.Sprint(ans.problem["detail"]), "max_connections_per_ip (4)") {
		t.Fatalf("a fifth busy connection from one IP: %+v %v", ans, err)
	}
	servedFrom("127.0.0.6")

	// Every slot busy: a new connection is refused, naming max_connections.
	for range 4 {
		dialFrom(t, "127.0.0.7", addr).upload("/v1/lanes/demo/jobs", "", 100)
	}
	full := dialFrom(t, "127.0.0.8", addr)
	fmt.Fprint(full, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if ans, err := full.read(5 * time.Second); err != nil || ans.status != 503 || ans.problem["field"] != "max_connections" ||
		ans.contentType != "application/problem+json" {
		t.Fatalf("a connection with every slot busy: %+v %v", ans, err)
	}
}

// TestIdleTimeoutUnderLoad: while three quarters of max_connections are
// open, a keep-alive connection idle for idle_timeout_under_load (1s here;
// idle_timeout stays 2m) is closed when the next connection comes.
func TestIdleTimeoutUnderLoad(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.HTTP.MaxConnections = 8
	cfg.HTTP.MaxConnectionsPerIP = 8
	cfg.HTTP.IdleTimeoutUnderLoad = config.Duration(time.Second)
	svc, _ := startLogged(t, cfg)
	var held []*peer
	for range 6 {
		p := dialFrom(t, "127.0.0.2", svc.Addr())
		if s := p.get(); s != 200 {
			t.Fatalf("answered %d", s)
		}
		held = append(held, p)
	}
	start := time.Now()
	waitFor(t, 15*time.Second, "idle connections closed under load", func() bool {
		p := dialFrom(t, "127.0.0.3", svc.Addr())
		p.get()
		p.Close()
		return held[0].closedByServer()
	})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("closed after %v: that is not the 1s idle timeout under load", took)
	}
}

// TestStalledUploadsLeaveOthersServed: eight stalled batch uploads from
// one submit-only key hold at most that key's share of max_body_inflight
// (max_body_inflight_per_caller): the uploads past it are refused 429
// naming the share, and other keys and IPs are served.
func TestStalledUploadsLeaveOthersServed(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.HTTP.MaxBodyInflight = 8 << 20
	cfg.HTTP.MaxBatchBytes = 1 << 20
	cfg.Auth.Keys = []config.Key{
		{ID: "uploader", SHA256: hexSum("uploader-secret"), Scopes: []string{"submit:demo"}},
		{ID: "other", SHA256: hexSum("other-secret"), Scopes: []string{"submit:demo"}},
	}
	if share := cfg.BodyInflightPerCaller(); share != 2<<20 {
		t.Fatalf("the default share is %d bytes, want a quarter of max_body_inflight", share)
	}
	svc, logs := startLogged(t, cfg)

	answers := make(chan answer, 8)
	for range 8 {
		p := dialFrom(t, "127.0.0.2", svc.Addr())
		p.upload("/v1/lanes/demo/jobs:batch", "uploader-secret", 1<<20)
		go func() {
			if a, err := p.read(20 * time.Second); err == nil {
				answers <- a
			}
		}()
	}
	for range 6 {
		select {
		case a := <-answers:
			if a.status != 429 || a.problem["field"] != "max_body_inflight_per_caller" ||
				!strings.Contains(fmt.Sprint(a.problem["detail"]), "share of 2097152 bytes") {
				t.Fatalf("an upload over the key's share: %+v", a)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("fewer than six of eight stalled uploads were refused\n%s", logs)
		}
	}
	// The other key is served, from another IP and from the same one.
	for _, ip := range []string{"127.0.0.3", "127.0.0.2"} {
		p := dialFrom(t, ip, svc.Addr())
		fmt.Fprint(p, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer other-secret\r\nContent-Length: 2\r\n\r\nhi")
		if a, err := p.read(5 * time.Second); err != nil || a.status != 202 {
			t.Fatalf("another key from %s: %+v %v", ip, a, err)
		}
		body := `[{"payload":"a"},{"payload":"b"}]`
		fmt.Fprintf(p, "POST /v1/lanes/demo/jobs:batch HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer other-secret\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		if a, err := p.read(5 * time.Second); err != nil || a.status >= 300 {
			t.Fatalf("another key's batch from %s: %+v %v", ip, a, err)
		}
	}
	// The two uploads within the share are still being read.
	select {
	case a := <-answers:
		t.Fatalf("an upload within the key's share was answered: %+v", a)
	default:
	}
}

// TestServerRefusalsAreProblems: what the HTTP server refuses before the
// API sees a request (net/http's own answers) is problem+json too, with
// the status, a detail and, where there is one, the field.
func TestServerRefusalsAreProblems(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	svc, _ := startLogged(t, cfg)
	for _, tc := range serverRefusals {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, dialFrom(t, "127.0.0.1", svc.Addr()))
		})
	}
}

// serverRefusal is a request net/http refuses before the API sees it, and
// the problem it gets.
type serverRefusal struct {
	name, request string
	status        int
	field         string
}

var serverRefusals = []serverRefusal{
	{"ControlByteInHeader", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\x01b\r\n\r\n", 400, ""},
	{"DELInHeader", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-A: a\x7fb\r\n\r\n", 400, ""},
	{"BadHeaderName", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Name: x\r\n\r\n", 400, "headers"},
	{"TwoHosts", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: other\r\n\r\n", 400, ""},
	{"NoHost", "GET /healthz HTTP/1.1\r\n\r\n", 400, "Host"},
	{"BadHost", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "Host"},
	{"HTTP09", "GET /healthz\r\n\r\n", 400, ""},
	{"HTTP09Version", "GET /healthz HTTP/0.9\r\nHost: localhost\r\n\r\n", 505, "version"},
	{"HTTP2Version", "GET /healthz HTTP/2.0\r\nHost: localhost\r\n\r\n", 505, "version"},
	{"MalformedRequestLine", "NOT-HTTP\r\n\r\n", 400, ""},
	{"BadMethod", "G(T /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, ""},
	{"BadContentLength", "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n", 400, ""},
	{"UnknownTransferEncoding", "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"},
	{"Expect", "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n", 417, "Expect"},
	{"HeadersTooLarge", "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + strings.Repeat("x", 1<<20+8192) + "\r\n\r\n", 431, "headers"},
}

// check sends the request on p and reads the problem, then the close.
func (tc serverRefusal) check(t *testing.T, p *peer) {
	t.Helper()
	go io.WriteString(p, tc.request) // a large head is answered before it is all sent
	a, err := p.read(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.status != tc.status || a.contentType != "application/problem+json" || a.problem == nil {
		t.Fatalf("answer %d %q %q, want %d problem+json", a.status, a.contentType, a.body, tc.status)
	}
	pr := a.problem
	if pr["type"] != "urn:throttler:problem:malformed-request" || pr["status"] != float64(tc.status) ||
		pr["detail"] == nil || pr["detail"] == "" || len(fmt.Sprint(pr["detail"])) > 200 {
		t.Fatalf("problem %s", a.body)
	}
	if f, _ := pr["field"].(string); f != tc.field {
		t.Fatalf("field %q, want %q: %s", f, tc.field, a.body)
	}
	if !p.closedByServer() {
		waitFor(t, 5*time.Second, "the connection closed", p.closedByServer)
	}
}

// TestTLSRefusalsAreProblems: over HTTPS as over HTTP, what net/http
// refuses before the API sees a request is problem+json, inside the TLS
// connection; HTTP/2 is still negotiated and served; a request over TLS,
// HTTP/1.1 or HTTP/2, is known to be (the Origin check takes the
// scheme's default port from the connection); and a client that connects
// and sends nothing holds no one else up.
func TestTLSRefusalsAreProblems(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.TLS = config.TLS{CertFile: pki.certFile, KeyFile: pki.keyFile}
	// The silent client's handshake lasts longer than the test.
	cfg.HTTP.ReadHeaderTimeout, cfg.HTTP.ReadTimeout = config.Duration(time.Minute), config.Duration(time.Minute)
	svc, _ := startLogged(t, cfg)
	silent := dialFrom(t, "127.0.0.1", svc.Addr())

	dialTLS := func(t *testing.T) *peer {
		t.Helper()
		c, err := tls.Dial("tcp", svc.Addr(), &tls.Config{RootCAs: pki.pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if p := c.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
			t.Fatalf("negotiated %q, want http/1.1", p)
		}
		return &peer{Conn: c, r: bufio.NewReader(c)}
	}
	for _, tc := range serverRefusals {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, dialTLS(t)) })
	}

	for _, c := range []struct {
		name  string
		major int
		tr    *http.Transport
	}{
		{"HTTP2", 2, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}, ForceAttemptHTTP2: true}},
		// A Transport with its own TLS config speaks only HTTP/1.1.
		{"HTTP1", 1, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer c.tr.CloseIdleConnections()
			client := &http.Client{Transport: c.tr, Timeout: 10 * time.Second}
			post := func(origin string) (*http.Response, string) {
				t.Helper()
				req, _ := http.NewRequest("POST", "https://localhost:"+strings.Split(svc.Addr(), ":")[1]+"/v1/lanes/demo/jobs", strings.NewReader("job"))
				// Host without a port: same origin only when the
				// connection is TLS (443 on both sides).
				req.Host = "localhost"
				req.Header.Set("Content-Type", "text/plain")
				req.Header.Set("Origin", origin)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp, string(b)
			}
			resp, body := post("https://localhost")
			if resp.StatusCode != http.StatusAccepted || resp.ProtoMajor != c.major {
				t.Fatalf("same-origin submit: %s %d %s", resp.Proto, resp.StatusCode, body)
			}
			if resp, body := post("http://localhost"); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, `"field":"Origin"`) {
				t.Fatalf("an http origin at an https server: %s %d %s", resp.Proto, resp.StatusCode, body)
			}
		})
	}
	if silent.closedByServer() {
		t.Fatal("the silent client's connection was closed: its handshake should still be waiting")
	}
}
