package apiserver_test

import (
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
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/apiserver"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func hexSum(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// parse reads a config file body with one lane and the given extra
// sections.
func parse(t *testing.T, extra string) config.Config {
	t.Helper()
	y := "listen: 127.0.0.1:0\n" + extra + `
lanes:
  - name: demo
    rate: 20/s
    target: {http: {url: http://127.0.0.1:9000/hook}}
  - name: other
    rate: 20/s
    target: {http: {url: http://127.0.0.1:9000/hook}}
`
	cfg, err := config.Parse("test.yaml", []byte(y), func(string) string { return "" })
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return cfg
}

// fakeAPI records what a reload sets.
type fakeAPI struct {
	http.Handler
	mu      sync.Mutex
	keys    [][]ingest.Key
	callers []ingest.CallerPolicy
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })}
}

func (f *fakeAPI) SetKeys(keys []ingest.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, keys)
	return nil
}

func (f *fakeAPI) SetCallers(p ingest.CallerPolicy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.callers = append(f.callers, p)
	return nil
}

func TestKeysScopes(t *testing.T) {
	t.Parallel()
	cfg := parse(t, `auth:
  keys:
    - {id: ops, sha256: `+hexSum("a")+`, scopes: [admin]}
    - {id: shop, sha256: `+hexSum("b")+`, scopes: ["submit:demo", "submit:other", read], plan: free}
    - {id: all, sha256: `+hexSum("c")+`, scopes: [submit]}
callers:
  plans: {free: {rate: 10/min, burst: 10}}
`)
	keys, err := cfg.LoadKeys()
	if err != nil {
		t.Fatal(err)
	}
	got := apiserver.Keys(keys)
	want := []ingest.Key{
		{ID: "ops", SHA256: sha256.Sum256([]byte("a")), Scopes: ingest.Scopes{Admin: true}},
		{ID: "shop", SHA256: sha256.Sum256([]byte("b")), Plan: "free", Scopes: ingest.Scopes{Read: true, SubmitLanes: []string{"demo", "other"}}},
		{ID: "all", SHA256: sha256.Sum256([]byte("c")), Scopes: ingest.Scopes{Submit: true}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Keys:\n got %+v\nwant %+v", got, want)
	}
	if got := apiserver.Keys(nil); got == nil || len(got) != 0 {
		t.Fatalf("Keys(nil) = %#v, want an empty list", got)
	}
}

func TestCallerPolicy(t *testing.T) {
	t.Parallel()
	cfg := parse(t, `callers:
  per_ip: {limit: 120, window: 1m, observe: true}
  trusted_proxies: [10.0.0.0/8]
  plans: {free: {rate: 10/min, burst: 5}, pro: {rate: 100/s, burst: 50, observe: true}}
  anonymous_plan: free
  default_plan: pro
`)
	p := apiserver.CallerPolicy(cfg.Callers)
	if p.PerIP.Limit != 120 || p.PerIP.Length != time.Minute || !p.ObserveIP {
		t.Errorf("per-IP layer: %+v observe=%v", p.PerIP, p.ObserveIP)
	}
	if len(p.TrustedProxies) != 1 || p.TrustedProxies[0].String() != "10.0.0.0/8" {
		t.Errorf("trusted proxies: %v", p.TrustedProxies)
	}
	if p.AnonymousPlan != "free" || p.DefaultPlan != "pro" {
		t.Errorf("plans by default: anonymous %q, default %q", p.AnonymousPlan, p.DefaultPlan)
	}
	free, pro := p.Plans["free"], p.Plans["pro"]
	if len(p.Plans) != 2 || free.Burst != 5 || free.Observe || pro.Burst != 50 || !pro.Observe {
		t.Errorf("plans: %+v", p.Plans)
	}
	if r := free.Rate.PerSecond(); r < 10.0/60-1e-9 || r > 10.0/60+1e-9 {
		t.Errorf("free plan rate %v/s, want 10/min", r)
	}
}

// selfSigned writes a certificate for localhost and its key to dir under
// name, and returns the certificate.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	return certFile, keyFile, cert
}

func TestTLSErrorsNameTheField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir, "a")
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, cert, key, ca, field string
	}{
		{"missing certificate", filepath.Join(dir, "nope.pem"), keyFile, "", "tls.cert_file"},
		{"certificate and key swapped", keyFile, certFile, "", "tls.cert_file"},
		{"missing client CA", certFile, keyFile, filepath.Join(dir, "nope-ca.pem"), "tls.client_ca_file"},
		{"client CA without PEM", certFile, keyFile, notPEM, "tls.client_ca_file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := parse(t, "")
			cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.ClientCAFile = c.cert, c.key, c.ca
			_, err := apiserver.New(cfg, slog.New(slog.DiscardHandler))
			var ce *config.Error
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("New: %v, want a config error on %s", err, c.field)
			}
		})
	}
}

// TestServeTLSReloadsCertificate: the API is served over TLS from
// tls.cert_file; Reload swaps in the file's new certificate for new
// connections, and a broken file keeps the one in use.
func TestServeTLSReloadsCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, first := selfSigned(t, dir, "first")
	cfg := parse(t, "")
	cfg.TLS.CertFile, cfg.TLS.KeyFile = certFile, keyFile
	var logs testenv.LogBuffer
	s, err := apiserver.New(cfg, logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if !s.TLS() {
		t.Fatal("TLS() is false with tls.cert_file")
	}
	if err := s.Reload(nil); !errors.Is(err, apiserver.ErrNotRunning) {
		t.Fatalf("Reload before Start: %v, want ErrNotRunning", err)
	}
	done, err := s.Start(newFakeAPI())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve ended with %v, want http.ErrServerClosed", err)
		}
	}()
	served := func() *x509.Certificate {
		t.Helper()
		// Verification is skipped: the test compares the certificate served.
		c, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	if got := served(); !got.Equal(first) {
		t.Fatalf("served %s, want the first certificate", got.Subject)
	}
	_, _, second := selfSigned(t, dir, "second")
	if err := s.Reload(nil); err != nil {
		t.Fatal(err)
	}
	if got := served(); !got.Equal(second) {
		t.Fatalf("after reload served %s, want the second certificate", got.Subject)
	}
	if err := os.WriteFile(certFile, []byte("broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ce *config.Error
	if err := s.Reload(nil); !errors.As(err, &ce) || ce.Field != "tls.cert_file" {
		t.Fatalf("Reload of a broken certificate: %v", err)
	}
	if got := served(); !got.Equal(second) {
		t.Fatalf("after a refused reload served %s, want the second certificate still", got.Subject)
	}
	if l := logs.String(); !strings.Contains(l, "reload: TLS certificate replaced") || !strings.Contains(l, "reload: TLS certificate refused; the one in use stays") {
		t.Fatalf("reload logs:\n%s", l)
	}
}

// TestReloadConfig: a config file read again swaps the API keys and the
// caller policy in; a file that fails to load changes nothing; turning
// the caller quotas off needs a restart.
func TestReloadConfig(t *testing.T) {
	t.Parallel()
	withCallers := func(secret, rate string) string {
		return `auth:
  keys:
    - {id: ops, sha256: ` + hexSum(secret) + `, scopes: [admin]}
callers:
  plans: {free: {rate: ` + rate + `, burst: 10}}
  default_plan: free
`
	}
	var logs testenv.LogBuffer
	s, err := apiserver.New(parse(t, withCallers("one", "10/min")), logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Auth().Keys; len(got) != 1 || got[0].SHA256 != sha256.Sum256([]byte("one")) {
		t.Fatalf("Auth keys: %+v", got)
	}
	api := startAPI(t, s)

	next := parse(t, withCallers("two", "20/min"))
	if err := s.Reload(func() (config.Config, error) { return next, nil }); err != nil {
		t.Fatal(err)
	}
	if len(api.keys) != 1 || len(api.keys[0]) != 1 || api.keys[0][0].SHA256 != sha256.Sum256([]byte("two")) {
		t.Fatalf("keys set by the reload: %+v", api.keys)
	}
	if len(api.callers) != 1 || api.callers[0].Plans["free"].Rate.PerSecond() != 20.0/60 {
		t.Fatalf("caller policies set by the reload: %+v", api.callers)
	}

	refused := errors.New("line 3: bad")
	if err := s.Reload(func() (config.Config, error) { return config.Config{}, refused }); !errors.Is(err, refused) {
		t.Fatalf("Reload of a refused file: %v", err)
	}
	if len(api.keys) != 1 || len(api.callers) != 1 {
		t.Fatalf("a refused file changed the API: %d key sets, %d policies", len(api.keys), len(api.callers))
	}

	off := parse(t, `auth:
  keys:
    - {id: ops, sha256: `+hexSum("three")+`, scopes: [admin]}
`)
	if err := s.Reload(func() (config.Config, error) { return off, nil }); err != nil {
		t.Fatal(err)
	}
	if len(api.callers) != 1 || len(api.keys) != 2 {
		t.Fatalf("callers turned off by a reload: %d policies (want 1), %d key sets (want 2)", len(api.callers), len(api.keys))
	}
	for _, want := range []string{"reload: API keys replaced", "reload: caller quotas replaced",
		"reload: config file refused; the keys and caller quotas in use stay", "turning caller quotas on or off needs a restart"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no log %q in:\n%s", want, logs.String())
		}
	}
}

// TestReloadWithoutKeys: an API started without keys stays open; a reload
// sets no keys (ingest refuses to switch) and the certificate-less server
// has nothing else to swap.
func TestReloadWithoutKeys(t *testing.T) {
	t.Parallel()
	s, err := apiserver.New(parse(t, ""), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if s.TLS() || len(s.Auth().Keys) != 0 {
		t.Fatalf("TLS %v, keys %d: want plain HTTP without keys", s.TLS(), len(s.Auth().Keys))
	}
	api := startAPI(t, s)
	resp, err := http.Get("http://" + s.Addr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET through the server: %d", resp.StatusCode)
	}
	if err := s.Reload(func() (config.Config, error) { return parse(t, ""), nil }); err != nil {
		t.Fatal(err)
	}
	if len(api.keys) != 0 || len(api.callers) != 0 {
		t.Fatalf("a reload without keys or callers set %d key sets, %d policies", len(api.keys), len(api.callers))
	}
}

func TestStartListenError(t *testing.T) {
	t.Parallel()
	cfg := parse(t, "")
	cfg.Listen = "127.0.0.1:notaport"
	s, err := apiserver.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(newFakeAPI()); err == nil || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("Start on a bad address: %v", err)
	}
}

// TestReloadCallersAfterIgnoredOff: a reload whose file turns the caller
// quotas off is ignored (it needs a restart), so the quotas stay on, and a
// later reload with a callers section replaces them as usual instead of
// being taken for turning them on.
func TestReloadCallersAfterIgnoredOff(t *testing.T) {
	t.Parallel()
	withCallers := func(rate string) config.Config {
		return parse(t, `callers:
  plans: {free: {rate: `+rate+`, burst: 10}}
  default_plan: free
`)
	}
	var logs testenv.LogBuffer
	s, err := apiserver.New(withCallers("10/min"), logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	api := startAPI(t, s)
	if err := s.Reload(func() (config.Config, error) { return parse(t, ""), nil }); err != nil {
		t.Fatal(err)
	}
	if len(api.callers) != 0 || !strings.Contains(logs.String(), "turning caller quotas on or off needs a restart") {
		t.Fatalf("callers turned off by a reload: %d policies set (want 0), log:\n%s", len(api.callers), logs.String())
	}
	if err := s.Reload(func() (config.Config, error) { return withCallers("30/min"), nil }); err != nil {
		t.Fatal(err)
	}
	if len(api.callers) != 1 || api.callers[0].Plans["free"].Rate.PerSecond() != 30.0/60 {
		t.Fatalf("caller policies set by the reload after an ignored off: %+v\nlog:\n%s", api.callers, logs.String())
	}
}

// startAPI serves a fake API through s until the test ends.
func startAPI(t *testing.T, s *apiserver.Server) *fakeAPI {
	t.Helper()
	api := newFakeAPI()
	done, err := s.Start(api)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Shutdown(context.Background())
		<-done
	})
	return api
}

// TestReloadWithoutKeysRefused: a file with no keys at all, read again by
// a server started with keys, is refused as a whole, naming auth.keys:
// turning the keys off needs a restart. The keys in use used to stay
// (those of the file read at start) while the log said they were replaced,
// so the key an operator removed kept working without a word.
func TestReloadWithoutKeysRefused(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	s, err := apiserver.New(parse(t, `auth:
  keys:
    - {id: ops, sha256: `+hexSum("one")+`, scopes: [admin]}
callers:
  plans: {free: {rate: 10/min, burst: 10}}
`), logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	api := startAPI(t, s)
	err = s.Reload(func() (config.Config, error) {
		return parse(t, "callers:\n  plans: {free: {rate: 1000/min, burst: 1000}}\n"), nil
	})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Field != "auth.keys" {
		t.Fatalf("Reload of a file without keys: %v, want a config error naming auth.keys", err)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.keys) != 0 || len(api.callers) != 0 {
		t.Fatalf("a refused file changed the API: %d key sets, %d policies", len(api.keys), len(api.callers))
	}
	if !strings.Contains(logs.String(), "reload: config file refused") || strings.Contains(logs.String(), "API keys replaced") {
		t.Fatalf("log:\n%s", logs.String())
	}
}

// TestReloadWithKeysOnOpenAPIRefused: keys added to the file of a server
// started without any are refused naming auth.keys (they need a restart);
// the reload used to pass in silence and the API stayed open.
func TestReloadWithKeysOnOpenAPIRefused(t *testing.T) {
	t.Parallel()
	s, err := apiserver.New(parse(t, ""), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	startAPI(t, s)
	err = s.Reload(func() (config.Config, error) {
		return parse(t, "auth:\n  keys:\n    - {id: ops, sha256: "+hexSum("one")+", scopes: [admin]}\n"), nil
	})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Field != "auth.keys" {
		t.Fatalf("Reload of a file with keys on an open API: %v, want a config error naming auth.keys", err)
	}
}
