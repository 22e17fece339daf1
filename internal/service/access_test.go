package service_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// startLogged is start with the service's JSON log captured (and copied
// to the test's output).
func startLogged(t *testing.T, cfg config.Config) (*service.Service, *testenv.LogBuffer) {
	t.Helper()
	logs := &testenv.LogBuffer{}
	svc := service.New(cfg, slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), nil)), nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-errc:
		cancel()
		t.Fatalf("service did not start: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("service not ready after 20s")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return svc, logs
}

// runFails runs a service that must not start and returns its error.
func runFails(t *testing.T, cfg config.Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), nil).Run(ctx)
	if err == nil {
		t.Fatal("Run started and stopped without an error")
	}
	return err
}

func hexSum(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// call sends one request with an optional API key and returns the status.
func call(t *testing.T, client *http.Client, method, url, secret, body string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestKeysFileReload: keys come from auth.keys_file; Reload (SIGHUP)
// swaps them without dropping a request in flight, and a bad file is
// logged and leaves the keys in use.
func TestKeysFileReload(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 1000, 100)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	writeKeys := func(content string) {
		t.Helper()
		// Write aside and rename, as a Kubernetes Secret volume does.
		tmp := keysFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, keysFile); err != nil {
			t.Fatal(err)
		}
	}
	writeKeys("- {id: old, sha256: " + hexSum("old-secret") + ", scopes: [submit]}\n")
	cfg.Auth.KeysFile = keysFile
	svc, logs := startLogged(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	jobs := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"

	if code := call(t, client, "POST", jobs, "", "x"); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if code := call(t, client, "POST", jobs, "old-secret", "x"); code != 202 {
		t.Fatalf("old key: %d", code)
	}

	// A request in flight with the old key: authorized, reading its body
	// (the server asks for it with 100 Continue once the handler reads).
	inflight, err := net.Dial("tcp", svc.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Close()
	fmt.Fprintf(inflight, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer old-secret\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	inflight.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(inflight)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("in-flight request: %q %v", line, err)
	}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	writeKeys("- {id: new, sha256: " + hexSum("new-secret") + ", scopes: [submit, read]}\n")
	if err := svc.Reload(); err != nil {
		t.Fatal(err)
	}
	if code := call(t, client, "POST", jobs, "old-secret", "x"); code != 401 {
		t.Fatalf("old key after reload: %d", code)
	}
	if code := call(t, client, "POST", jobs, "new-secret", "x"); code != 202 {
		t.Fatalf("new key after reload: %d", code)
	}
	// The request authorized before the reload finishes.
	inflight.Write([]byte("hello"))
	inflight.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 202 {
		t.Fatalf("in-flight request across the reload: %v %v", resp, err)
	}
	resp.Body.Close()

	// A bad file: refused, logged, the keys in use stay.
	writeKeys("- {id: broken, sha256: not-a-hash, scopes: [admin]}\n")
	err = svc.Reload()
	var ce *config.Error
	if !errors.As(err, &ce) || ce.File != keysFile || ce.Field != "[0].sha256" {
		t.Fatalf("Reload of a bad file: %v", err)
	}
	if code := call(t, client, "POST", jobs, "new-secret", "x"); code != 202 {
		t.Fatalf("new key after a refused reload: %d", code)
	}
	writeKeys("[]\n")
	if err := svc.Reload(); err == nil {
		t.Fatal("an empty keys file was taken")
	}
	if code := call(t, client, "POST", jobs, "", "x"); code != 401 {
		t.Fatalf("an empty keys file opened the API: %d", code)
	}
	l := logs.String()
	if !strings.Contains(l, `"msg":"reload: API keys replaced"`) || !strings.Contains(l, `"msg":"reload: keys_file refused; the keys in use stay"`) {
		t.Fatalf("reload logs missing:\n%s", l)
	}
	waitFor(t, 5*time.Second, "4 jobs delivered", func() bool { return len(rec.snapshot()) == 4 })
}

// TestSecretsNeverShown reproduces the leaks: the NATS URL with its
// password was logged at info on every start, and a target URL's
// credentials could be read back. Now neither the log, /v1/lanes nor
// /metrics holds a password, a token or a query value of a secret URL.
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATSWith(t, &server.Options{Port: -1, StoreDir: t.TempDir(), Username: "thr", Password: "nats-pw-1234"})

	rec := newRecorder(t)
	target := strings.Replace(rec.srv.URL, "http://", "http://hookuser:hook-pw-5678@", 1) + "/hook?token=hook-token-9012"
	cfg := testConfig(t, t.TempDir(), target, 100, 10)
	cfg.NATS.URL = fmt.Sprintf("nats://thr:nats-pw-1234@127.0.0.1:%d", ns.Addr().(*net.TCPAddr).Port)
	cfg.Lanes[0].Target.HTTP.Headers = map[string]string{"Authorization": "Bearer header-secret-3456"}
	cfg.Lanes[0].Target.HTTP.SigningSecrets = []string{"whsec_c2lnbmluZy1zZWNyZXQtNzg5MDEyMzQ1Njc="}
	svc, logs := startLogged(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "j1", "x"); code != 202 {
		t.Fatalf("submit: %d", code)
	}
	waitFor(t, 5*time.Second, "the job delivered", func() bool { return len(rec.snapshot()) == 1 })
	resp, err := client.Get("http://" + svc.Addr() + "/v1/lanes")
	if err != nil {
		t.Fatal(err)
	}
	lanes, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, metricsText := servicetest.Scrape(t, svc.Addr(), "")
	shown := map[string]string{"log": logs.String(), "/v1/lanes": string(lanes), "/metrics": metricsText}
	for where, text := range shown {
		for _, secret := range []string{"nats-pw-1234", "hook-pw-5678", "hook-token-9012", "header-secret-3456", "c2lnbmluZy1zZWNyZXQtNzg5MDEy"} {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows %s:\n%s", where, secret, text)
			}
		}
	}
	if !strings.Contains(shown["log"], `"nats":"nats://thr:***@127.0.0.1:`) {
		t.Errorf("the ready line does not name the redacted NATS URL:\n%s", shown["log"])
	}
	if !strings.Contains(string(lanes), `hookuser:***@`) || !strings.Contains(string(lanes), `/hook?token=***`) {
		t.Errorf("/v1/lanes target: %s", lanes)
	}
}

// TestConnectionErrorsAreRedacted: a NATS or Redis URL that fails at
// start is named without its password.
func TestConnectionErrorsAreRedacted(t *testing.T) {
	t.Parallel()
	closed := testenv.ClosedAddr(t)
	rec := newRecorder(t)
	t.Run("NATS", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
		cfg.NATS.URL = "nats://thr:nats-pw-1234@" + closed
		err := runFails(t, cfg)
		if strings.Contains(err.Error(), "nats-pw-1234") || !strings.Contains(err.Error(), "nats.url nats://thr:***@"+closed) {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("RedisBadURL", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
		cfg.Redis.URL = "redis://u:redis-pw-5678@" + closed + "/not-a-db"
		err := runFails(t, cfg)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Field != "redis.url" || strings.Contains(err.Error(), "redis-pw-5678") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("RedisUnreachable", func(t *testing.T) {
		cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
		cfg.Redis.URL = "redis://u:redis-pw-5678@" + closed + "/0"
		_, logs := startLogged(t, cfg)
		if l := logs.String(); strings.Contains(l, "redis-pw-5678") || !strings.Contains(l, "redis unreachable at start") {
			t.Fatalf("logs:\n%s", l)
		}
	})
}

// TestHTTPBoundsWired: the http section reaches the server: a slow body is
// cut at read_timeout and a connection over max_connections, with none
// idle, is answered 503 and closed.
func TestHTTPBoundsWired(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.HTTP.ReadTimeout = config.Duration(2 * time.Second)
	cfg.HTTP.MaxConnections = 2
	svc, _ := startLogged(t, cfg)

	// The clock is read before the dial: the server's read_timeout runs
	// from its accept, so a stall of this goroutine after the dial (seen
	// under load: 0.4 s) only lengthens the time measured, never shortens
	// it below the timeout.
	start := time.Now()
	slow, err := net.Dial("tcp", svc.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprint(slow, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nx")
	// A second upload in progress: neither connection is idle, so the
	// third finds no idle one to close in its place.
	other, err := net.Dial("tcp", svc.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fmt.Fprint(other, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nx")
	third, err := net.Dial("tcp", svc.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	fmt.Fprint(third, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil || resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third connection: %v %v", resp, err)
	}
	slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err = http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("slow body: %v %v", resp, err)
	}
	if took := time.Since(start); took < 1900*time.Millisecond || took > 5*time.Second {
		t.Fatalf("slow body cut after %v, want about 2s", took)
	}
}

// testPKI is a CA with a server and a client certificate, written as PEM
// files.
type testPKI struct {
	dir                       string
	ca                        *x509.Certificate
	caKey                     *ecdsa.PrivateKey
	caFile, certFile, keyFile string
	clientCert                tls.Certificate
	pool                      *x509.CertPool
	serial                    int64
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), serial: 1}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.caKey = key
	p.pool = x509.NewCertPool()
	p.pool.AddCert(p.ca)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	p.certFile, p.keyFile = filepath.Join(p.dir, "server.pem"), filepath.Join(p.dir, "server-key.pem")
	p.issueServer(t, "server one")
	cder, ckey := p.issue(t, "client", x509.ExtKeyUsageClientAuth)
	p.clientCert = tls.Certificate{Certificate: [][]byte{cder}, PrivateKey: ckey}
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (p *testPKI) issue(t *testing.T, cn string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	p.serial++
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// issueServer writes a new server certificate and key over the files.
func (p *testPKI) issueServer(t *testing.T, cn string) {
	t.Helper()
	der, key := p.issue(t, cn, x509.ExtKeyUsageServerAuth)
	kder, _ := x509.MarshalECPrivateKey(key)
	p.write(t, "server.pem", "CERTIFICATE", der)
	p.write(t, "server-key.pem", "EC PRIVATE KEY", kder)
}

// TestTLS: the API over HTTPS with a certificate that Reload replaces;
// under mutual TLS a client without a certificate is refused, one with a
// certificate of the CA is served, and a refused connection over
// max_connections still gets its 503 over TLS.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	cfg.TLS = config.TLS{CertFile: pki.certFile, KeyFile: pki.keyFile, ClientCAFile: pki.caFile}
	cfg.HTTP.MaxConnections = 1
	svc, logs := startLogged(t, cfg)
	url := "https://" + svc.Addr() + "/healthz"
	var serveOnce func(cert []tls.Certificate) (string, error)

	// max_connections is 1 and a closed connection counts until the server
	// has seen it close: a check that meets the cap's 503 tries again.
	served := func(cert []tls.Certificate) (string, error) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			cn, err := serveOnce(cert)
			if err == nil || !strings.Contains(err.Error(), "status 503") || time.Now().After(deadline) {
				return cn, err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	serveOnce = func(cert []tls.Certificate) (string, error) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.pool, Certificates: cert}, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return "", fmt.Errorf("status %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].Subject.CommonName, nil
	}
	if _, err := served(nil); err == nil {
		t.Fatal("a client without a certificate was served under mutual TLS")
	}
	cn, err := served([]tls.Certificate{pki.clientCert})
	if err != nil || cn != "server one" {
		t.Fatalf("client with a certificate: %q %v", cn, err)
	}
	// Plain HTTP on the TLS port is refused with a problem naming the
	// scheme.
	// (A connection still counted against max_connections 1 is refused
	// over TLS, which a plain client cannot read: it tries again.)
	var plain *http.Response
	var plainBody []byte
	waitFor(t, 5*time.Second, "an answer to plain HTTP", func() bool {
		resp, err := pollClient.Get("http://" + svc.Addr() + "/healthz")
		if err != nil {
			return false
		}
		plainBody, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		plain = resp
		return true
	})
	if plain.StatusCode != 400 || plain.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(plainBody), `"field":"scheme"`) {
		t.Fatalf("plain HTTP on the TLS listener: %d %q %s", plain.StatusCode, plain.Header.Get("Content-Type"), plainBody)
	}

	pki.issueServer(t, "server two")
	if err := svc.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn, err := served([]tls.Certificate{pki.clientCert}); err != nil || cn != "server two" {
		t.Fatalf("after reload: %q %v", cn, err)
	}
	// A broken certificate file is refused; the one in use stays.
	os.WriteFile(pki.certFile, []byte("not pem"), 0o600)
	if err := svc.Reload(); err == nil {
		t.Fatal("a broken certificate was taken")
	}
	if cn, err := served([]tls.Certificate{pki.clientCert}); err != nil || cn != "server two" {
		t.Fatalf("after a refused reload: %q %v", cn, err)
	}

	// max_connections 1: hold one connection that is served (the earlier
	// ones may still count until the server has closed them), then the
	// next one gets a 503 over TLS.
	var hold *tls.Conn
	waitFor(t, 5*time.Second, "a connection served and held", func() bool {
		c, err := tls.Dial("tcp", svc.Addr(), &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clientCert}})
		if err != nil {
			return false
		}
		fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil && resp.StatusCode == 200 {
			resp.Body.Close()
			// An upload in progress (an idle connection would give way to
			// the next one): the 100 Continue says its handler runs.
			fmt.Fprint(c, "POST /v1/lanes/demo/jobs HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n")
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
				t.Fatalf("an upload on the held connection: %q %v", line, err)
			}
			hold = c
			return true
		}
		c.Close()
		return false
	})
	defer hold.Close()
	if _, err := serveOnce([]tls.Certificate{pki.clientCert}); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Fatalf("a connection over max_connections: %v", err)
	}
	if !strings.Contains(logs.String(), "tls: client didn't provide a certificate") {
		t.Errorf("the refused handshake is not logged:\n%s", logs)
	}
}
