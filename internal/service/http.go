package service

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/ingest"
)

// access is what Reload swaps while the service runs: the API (for its
// keys) and the TLS certificate.
type access struct {
	mu   sync.Mutex
	api  *ingest.Handler // set once the API is built
	cert atomic.Pointer[tls.Certificate]
}

// apiAuth reads every API key (auth.keys and auth.keys_file) into the
// API's form and logs how the API is open.
func (s *Service) apiAuth() (ingest.Auth, error) {
	keys, err := s.cfg.LoadKeys()
	if err != nil {
		return ingest.Auth{}, err
	}
	switch {
	case len(keys) > 0:
		s.log.Info("API keys required", "keys", len(keys), "keys_file", s.cfg.Auth.KeysFile)
	case s.cfg.LoopbackListen():
		s.log.Info("no API keys: the API is open to callers on this host", "listen", s.cfg.Listen)
	default:
		// Validate allows this only with auth.anonymous: true.
		s.log.Warn("auth.anonymous: no API keys on a non-loopback listen; anyone who reaches it may submit jobs, change lane limits and read, replay or delete dead letters",
			"listen", s.cfg.Listen, "field", "auth.anonymous")
	}
	return ingest.Auth{Keys: apiKeys(keys), Hosts: s.cfg.Auth.Hosts, PublicMetrics: s.cfg.Auth.PublicMetrics}, nil
}

// apiKeys turns validated config keys into the API's keys.
func apiKeys(keys []config.Key) []ingest.Key {
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
func (s *Service) tlsConfig() (*tls.Config, error) {
	t := s.cfg.TLS
	if t.CertFile == "" {
		return nil, nil
	}
	if err := s.loadCert(); err != nil {
		return nil, err
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.access.cert.Load(), nil
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
func (s *Service) loadCert() error {
	t := s.cfg.TLS
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return &config.Error{Field: "tls.cert_file", Msg: fmt.Sprintf("%s and %s: %v", t.CertFile, t.KeyFile, err)}
	}
	s.access.cert.Store(&cert)
	return nil
}

// listen opens the API's listener: at most http.max_connections open at
// once (one more is answered 503 and closed).
func (s *Service) listen(tc *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	return ingest.LimitListener(ln, ingest.ListenerConfig{
		MaxConnections: s.cfg.HTTP.MaxConnections, TLS: tc, Logger: s.log.With("component", "http"),
	}), nil
}

// httpServer is the API's server with the http section's bounds. Its own
// errors (TLS handshakes refused, a client without a certificate under
// mutual TLS) go to the log at warn.
func (s *Service) httpServer(h http.Handler, tc *tls.Config) *http.Server {
	c := s.cfg.HTTP
	return &http.Server{
		Handler:           h,
		TLSConfig:         tc,
		ReadHeaderTimeout: c.ReadHeaderTimeout.D(),
		ReadTimeout:       c.ReadTimeout.D(),
		IdleTimeout:       c.IdleTimeout.D(),
		ErrorLog:          slog.NewLogLogger(s.log.With("component", "http").Handler(), slog.LevelWarn),
	}
}

// errNotRunning: Reload before the API is up.
var errNotRunning = errors.New("service: reload: the API is not running yet")

// Reload reads auth.keys_file (with ReloadConfigWith, the config file's
// auth keys and callers section too) and the TLS certificate and key again and
// swaps them in at once, without dropping a connection or a request in
// flight (what SIGHUP does). A file that fails its checks is logged and
// the keys or certificate in use stay. It returns what failed.
func (s *Service) Reload() error {
	s.access.mu.Lock()
	defer s.access.mu.Unlock()
	if s.access.api == nil {
		return errNotRunning
	}
	var errs []error
	cfg := s.cfg
	if s.reloadConfig != nil {
		next, err := s.reloadConfig()
		if err != nil {
			s.log.Error("reload: config file refused; the keys and caller quotas in use stay", "err", err)
			return err
		}
		if err := reloadCallers(s.log, s.access.api, s.cfg.Callers, next.Callers); err != nil {
			errs = append(errs, err)
		}
		if next.HasKeys() && s.cfg.HasKeys() {
			cfg.Auth = next.Auth
		}
		cfg.Callers = next.Callers
	}
	if cfg.HasKeys() && (s.reloadConfig != nil || cfg.Auth.KeysFile != "") {
		keys, err := cfg.LoadKeys()
		if err == nil {
			err = s.access.api.SetKeys(apiKeys(keys))
		}
		if err != nil {
			s.log.Error("reload: keys_file refused; the keys in use stay", "err", err)
			errs = append(errs, err)
		} else {
			s.log.Info("reload: API keys replaced", "keys", len(keys), "keys_file", cfg.Auth.KeysFile)
		}
	}
	s.cfg.Auth, s.cfg.Callers = cfg.Auth, cfg.Callers
	if s.cfg.TLS.CertFile != "" {
		if err := s.loadCert(); err != nil {
			s.log.Error("reload: TLS certificate refused; the one in use stays", "err", err)
			errs = append(errs, err)
		} else {
			s.log.Info("reload: TLS certificate replaced", "cert_file", s.cfg.TLS.CertFile)
		}
	}
	return errors.Join(errs...)
}
