package ingest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// testCert is a self-signed certificate for 127.0.0.1 and the pool that
// trusts it.
func testCert(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "listener test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestTLSListener: with TLS the listener does the handshake itself,
// without holding Accept for a client that sends nothing; HTTP/2 is
// negotiated and served as with ServeTLS, HTTP/1.1 requests carry their
// TLS state, the server's own refusals are problem+json inside TLS, plain
// HTTP on the port is answered with a problem naming the scheme, idle
// connections over TLS are known as idle, every connection closed gives
// its place back, and Close ends the handshake in progress.
func TestTLSListener(t *testing.T) {
	cert, pool := testCert(t)
	var logs testenv.LogBuffer
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proto=%d tls=%t", r.ProtoMajor, r.TLS != nil && r.TLS.HandshakeComplete)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	// A handshake timeout far longer than the test: what ends the silent
	// client's handshake is Close.
	l := LimitListener(ln, ListenerConfig{MaxConnections: 8, TLS: tc, HandshakeTimeout: time.Hour, Logger: logs.Logger()})
	l.Install(srv)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	addr := ln.Addr().String()

	silent := dial(t, addr) // connects and sends nothing

	h2 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer h2.CloseIdleConnections()
	resp, err := (&http.Client{Transport: h2, Timeout: 5 * time.Second}).Get("https://" + addr + "/")
	if err != nil {
		t.Fatalf("HTTP/2 past a silent client: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(body) != "proto=2 tls=true" {
		t.Fatalf("HTTP/2: %s %q", resp.Proto, body)
	}

	dialTLS := func() (*tls.Conn, *bufio.Reader) {
		t.Helper()
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	// HTTP/1.1 over TLS: the request has its TLS state; the connection,
	// kept alive, is counted idle, as is the HTTP/2 one without a stream
	// (its server reports that through ConnState too).
	c1, r1 := dialTLS()
	fmt.Fprint(c1, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
	if a := readTLSAnswer(t, c1, r1); a != "200 proto=1 tls=true" {
		t.Fatalf("HTTP/1.1 over TLS: %q", a)
	}
	testenv.Eventually(t, 5*time.Second, "the keep-alive connections counted idle", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.idle.Len() == 2
	})

	// The server's own refusal, inside TLS.
	c2, r2 := dialTLS()
	fmt.Fprint(c2, "GET / HTTP/1.1\r\nHost: localhost\r\nX-A: a\x01b\r\n\r\n")
	if a := readTLSAnswer(t, c2, r2); !strings.HasPrefix(a, `400 {"type":"`+ProblemMalformedRequest+`"`) {
		t.Fatalf("a control byte in a header over TLS: %q", a)
	}

	// Plain HTTP on the TLS port, with a method net/http's own check
	// does not know.
	p := dial(t, addr)
	fmt.Fprint(p, "PATCH /v1/lanes/demo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
	a := readTLSAnswer(t, p, bufio.NewReader(p))
	p.Close() // the listener reads what follows until the client closes
	if !strings.HasPrefix(a, "400 ") || !strings.Contains(a, `"field":"scheme"`) {
		t.Fatalf("plain HTTP on the TLS port: %q", a)
	}
	if !strings.Contains(logs.String(), "client sent an HTTP request to an HTTPS server") {
		t.Errorf("plain HTTP on the TLS port is not logged:\n%s", logs.String())
	}

	// Every connection but the silent one closed: only it counts.
	h2.CloseIdleConnections()
	c1.Close()
	c2.Close()
	testenv.Eventually(t, 5*time.Second, "closed connections uncounted", func() bool { return l.openConns() == 1 })

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != http.ErrServerClosed {
		t.Fatalf("Serve: %v", err)
	}
	// Close has ended the silent client's handshake.
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the silent client's connection after Close: %v, want EOF", err)
	}
	if n := l.openConns(); n != 0 {
		t.Fatalf("%d connections counted after Close", n)
	}
}

// TestTLSHandshakeTimeout: a client that connects and never finishes its
// handshake is closed after HandshakeTimeout, gives its place back, and
// the failure is logged.
func TestTLSHandshakeTimeout(t *testing.T) {
	cert, _ := testCert(t)
	var logs testenv.LogBuffer
	srv := &http.Server{Handler: http.NotFoundHandler()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(ln, ListenerConfig{MaxConnections: 8, HandshakeTimeout: 50 * time.Millisecond, Logger: logs.Logger(),
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}})
	l.Install(srv)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() { srv.Close(); <-done }()

	c := dial(t, ln.Addr().String())
	fmt.Fprint(c, "\x16\x03\x01") // the start of a record, then nothing
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a stalled handshake: %v, want EOF", err)
	}
	testenv.Eventually(t, 5*time.Second, "the stalled connection uncounted", func() bool { return l.openConns() == 0 })
	if !strings.Contains(logs.String(), "TLS handshake refused") || !strings.Contains(logs.String(), "timeout") {
		t.Fatalf("the stalled handshake is not logged:\n%s", logs.String())
	}
}

// TestTLSWithoutHTTP2: on a server that serves no HTTP/2 (TLSNextProto
// set without "h2", the historic way to turn it off) the listener does
// not offer h2, and a client that would take it is served HTTP/1.1.
func TestTLSWithoutHTTP2(t *testing.T) {
	cert, pool := testCert(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "proto=%d tls=%t", r.ProtoMajor, r.TLS != nil)
	}), TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(ln, ListenerConfig{MaxConnections: 8, HandshakeTimeout: 5 * time.Second,
		TLS: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}})
	l.Install(srv)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() { srv.Close(); <-done }()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "proto=1 tls=true" {
		t.Fatalf("%s %q", resp.Proto, body)
	}
}

// readTLSAnswer reads one response from c as "status body" (the body
// compacted when JSON).
func readTLSAnswer(t *testing.T, c net.Conn, r *bufio.Reader) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), problemContentType) {
		var p map[string]any
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("problem body %q: %v", b, err)
		}
		// Type first, for the prefix checks of the callers.
		typ, _ := json.Marshal(p["type"])
		delete(p, "type")
		rest, _ := json.Marshal(p)
		return fmt.Sprintf("%d {\"type\":%s,%s", resp.StatusCode, typ, rest[1:])
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

// BenchmarkTLSConn: a new TLS connection and one HTTP/1.1 request on it
// (P-256 certificate, TLS 1.3), with the listener doing TLS itself (the
// handshake in a goroutine of its own, then handed to the server) and, to
// compare, with http.Server.ServeTLS over the same listener without TLS.
//
//	go test -run '^$' -bench TLSConn -benchmem ./internal/ingest/
func BenchmarkTLSConn(b *testing.B) {
	cert, pool := testCert(b)
	for _, mode := range []string{"listener", "ServeTLS"} {
		b.Run(mode, func(b *testing.B) {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			tc := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
			cfg := ListenerConfig{MaxConnections: 1024}
			if mode == "listener" {
				cfg.TLS, cfg.HandshakeTimeout = tc, 10*time.Second
			}
			l := LimitListener(ln, cfg)
			l.Install(srv)
			done := make(chan struct{})
			go func() {
				defer close(done)
				if mode == "listener" {
					srv.Serve(l)
					return
				}
				srv.TLSConfig = tc
				srv.ServeTLS(l, "", "")
			}()
			defer func() { srv.Close(); <-done }()
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			url := "https://" + ln.Addr().String() + "/"
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}
