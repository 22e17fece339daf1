// Package apiserver serves the HTTP API (package ingest) as the config file
// describes it. It turns the file's sections into ingest's plain values: the
// API keys of auth (and keys_file), the caller quotas of callers, the running
// lanes as ingest's directory. It opens the listener (at most
// http.max_connections, at most http.max_connections_per_ip per client IP,
// idle keep-alive connections closed first; TLS with a certificate a
// reload swaps), applies the
// http section's timeouts, and reloads keys, caller quotas and certificate
// without dropping a connection. ingest itself knows nothing of the file.
package apiserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/ingest"
)

// Server is the API's HTTP server. New reads what it needs, Start listens
// and serves, Shutdown stops; Reload may be called from any goroutine.
type Server struct {
	log  *slog.Logger
	auth ingest.Auth
	tls  *tls.Config // nil without tls.cert_file
	cert atomic.Pointer[tls.Certificate]

	mu  sync.Mutex // held by Start and Reload
	cfg config.Config
	api API // set by Start
	srv *http.Server
	ln  *ingest.Listener
}

// API is what the server serves and what a reload changes in it: the
// handler of package ingest.
type API interface {
	http.Handler
	SetKeys(keys []ingest.Key) error
	SetCallers(p ingest.CallerPolicy) error
}

var _ API = (*ingest.Handler)(nil)

// ErrNotRunning is Reload's error before Start.
var ErrNotRunning = errors.New("apiserver: reload: the API is not running yet")

// New reads every API key (auth.keys and auth.keys_file) and the TLS
// certificate of cfg, and logs how the API is open. It opens nothing.
func New(cfg config.Config, log *slog.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log}
	keys, err := cfg.LoadKeys()
	if err != nil {
		return nil, err
	}
	switch {
	case len(keys) > 0:
		log.Info("API keys required", "keys", len(keys), "keys_file", cfg.Auth.KeysFile)
	case cfg.LoopbackListen():
		log.Info("no API keys: the API is open to callers on this host", "listen", cfg.Listen)
	default:
		// Validate allows this only with auth.anonymous: true.
		log.Warn("auth.anonymous: no API keys on a non-loopback listen; anyone who reaches it may submit jobs, change lane limits and read, replay or delete dead letters",
			"listen", cfg.Listen, "field", "auth.anonymous")
	}
	s.auth = ingest.Auth{Keys: Keys(keys), Hosts: cfg.Auth.Hosts, PublicMetrics: cfg.Auth.PublicMetrics}
	if s.tls, err = s.tlsConfig(); err != nil {
		return nil, err
	}
	return s, nil
}

// Auth is the API's keys and hosts, for ingest.Config.
func (s *Server) Auth() ingest.Auth { return s.auth }

// TLS says whether the API is served over TLS.
func (s *Server) TLS() bool { return s.tls != nil }

// Keys turns validated config keys into the API's keys.
func Keys(keys []config.Key) []ingest.Key {
	out := make([]ingest.Key, 0, len(keys))
	for _, k := range keys {
		ik := ingest.Key{ID: k.ID, SHA256: k.Digest(), Plan: k.Plan}
		for _, sc := range k.Scopes {
			name, lane, _ := config.ParseScope(sc) // validated by config
			switch {
			case name == config.ScopeAdmin:
				ik.Scopes.Admin = true
			case name == config.ScopeRead:
				ik.Scopes.Read = true
			case name == config.ScopeSubmit && lane == "":
				ik.Scopes.Submit = true
			case name == config.ScopeSubmit:
				ik.Scopes.SubmitLanes = append(ik.Scopes.SubmitLanes, lane)
			}
		}
		out = append(out, ik)
	}
	return out
}

// tlsConfig loads the certificate and returns the listener's TLS config,
// or nil without tls.cert_file. The certificate is served from an atomic
// pointer that Reload swaps.
func (s *Server) tlsConfig() (*tls.Config, error) {
	t := s.cfg.TLS
	if t.CertFile == "" {
		return nil, nil
	}
	if err := s.loadCert(); err != nil {
		return nil, err
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// What http.Server.ServeTLS would offer: the listener terminates
		// TLS itself (ingest.ListenerConfig.TLS) and hands HTTP/2
		// connections to the server's HTTP/2.
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cert.Load(), nil
		},
	}
	if t.ClientCAFile != "" {
		pem, err := os.ReadFile(t.ClientCAFile)
		if err != nil {
			return nil, &config.Error{Field: "tls.client_ca_file", Msg: err.Error()}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &config.Error{Field: "tls.client_ca_file", Msg: fmt.Sprintf("%s holds no PEM certificate", t.ClientCAFile)}
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// loadCert reads tls.cert_file and tls.key_file and serves them from now
// on; on an error the certificate served so far stays.
func (s *Server) loadCert() error {
	t := s.cfg.TLS
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return &config.Error{Field: "tls.cert_file", Msg: fmt.Sprintf("%s and %s: %v", t.CertFile, t.KeyFile, err)}
	}
	s.cert.Store(&cert)
	return nil
}

// Start opens the listener on cfg.Listen (at most http.max_connections
// open at once and http.max_connections_per_ip per client IP: one more
// closes the longest-idle keep-alive connection, or with none idle is
// answered 503 and closed) and serves api there
// with the http section's bounds. The channel gets the error that stopped
// serving (http.ErrServerClosed after Shutdown).
func (s *Server) Start(api API) (<-chan error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	httpLog := s.log.With("component", "http")
	c := s.cfg.HTTP
	s.ln = ingest.LimitListener(ln, ingest.ListenerConfig{MaxConnections: c.MaxConnections, MaxPerIP: c.ConnectionsPerIP(),
		IdleUnderLoad: c.IdleUnderLoad(), TrustedProxies: s.trustedProxies(),
		TLS: s.tls, HandshakeTimeout: handshakeTimeout(c.ReadHeaderTimeout.D(), c.ReadTimeout.D()), Logger: httpLog})
	s.srv = &http.Server{
		// No TLSConfig: the listener does TLS (refused handshakes, a
		// client without a certificate under mutual TLS, are its log
		// lines), and without one Serve sets up HTTP/2 for the *tls.Conn
		// it hands over (http.Server.shouldConfigureHTTP2ForServe).
		Handler:           api,
		ReadHeaderTimeout: c.ReadHeaderTimeout.D(),
		ReadTimeout:       c.ReadTimeout.D(),
		IdleTimeout:       c.IdleTimeout.D(),
		// Its own errors go to the log at warn.
		ErrorLog: slog.NewLogLogger(httpLog.Handler(), slog.LevelWarn),
	}
	// The listener closes idle keep-alive connections first when a bound
	// is reached, and rewrites the server's own refusals: it learns which
	// connections are idle or handling a request from the server.
	s.ln.Install(s.srv)
	done := make(chan error, 1)
	go func(srv *http.Server, ln net.Listener) {
		done <- srv.Serve(ln) // TLS, when on, is the listener's
	}(s.srv, s.ln)
	s.api = api
	return done, nil
}

// handshakeTimeout is the bound net/http puts on a TLS handshake: the
// least of the server's timeouts that are set (http.Server's
// tlsHandshakeTimeout); zero when none is.
func handshakeTimeout(ds ...time.Duration) time.Duration {
	var least time.Duration
	for _, d := range ds {
		if d > 0 && (least == 0 || d < least) {
			least = d
		}
	}
	return least
}

// trustedProxies are the peers exempt from http.max_connections_per_ip:
// callers.trusted_proxies, whose connections carry many clients.
func (s *Server) trustedProxies() []netip.Prefix {
	if s.cfg.Callers == nil {
		return nil
	}
	return s.cfg.Callers.TrustedPrefixes()
}

// Addr is the listener's address; valid after Start.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops accepting and waits, within ctx, for the requests in
// flight (http.Server.Shutdown).
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }
