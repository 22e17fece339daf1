package apiserver

import (
	"errors"

	"github.com/throttler/throttler/internal/config"
)

// Reload reads auth.keys_file and the TLS certificate and key again and
// swaps them in at once, without dropping a connection or a request in
// flight. With load (the config file read again), the file's auth keys and
// callers section take effect too; its other settings need a restart. A
// file that fails its checks, or that turns API keys on or off, is logged
// and the keys, quotas or certificate in use stay. It returns what failed.
func (s *Server) Reload(load func() (config.Config, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.api == nil {
		return ErrNotRunning
	}
	var errs []error
	cfg := s.cfg
	if load != nil {
		next, err := load()
		if err != nil {
			s.log.Error("reload: config file refused; the keys and caller quotas in use stay", "err", err)
			return err
		}
		if next.HasKeys() != s.cfg.HasKeys() {
			// Keys on or off need a restart; keeping the keys in use (or
			// none) while taking the rest would let a removed key work,
			// or leave open an API the file now closes, without a word.
			msg := "the file has no keys and the API started with some: turning API keys off needs a restart"
			if next.HasKeys() {
				msg = "the file has keys and the API started without: turning API keys on needs a restart"
			}
			err := &config.Error{Field: "auth.keys", Msg: msg}
			s.log.Error("reload: config file refused; the keys and caller quotas in use stay", "err", err)
			return err
		}
		// The section in force changes only when the API took it: one
		// that is ignored (quotas turned on or off) or refused leaves the
		// quotas in use, and the next reload compares with them.
		if err := s.reloadCallers(next.Callers); err != nil {
			errs = append(errs, err)
		} else if (s.cfg.Callers == nil) == (next.Callers == nil) {
			cfg.Callers = next.Callers
		}
		cfg.Auth = next.Auth
	}
	if cfg.HasKeys() && (load != nil || cfg.Auth.KeysFile != "") {
		keys, err := cfg.LoadKeys()
		if err == nil {
			err = s.api.SetKeys(Keys(keys))
		}
		if err != nil {
			s.log.Error("reload: keys_file refused; the keys in use stay", "err", err)
			errs = append(errs, err)
		} else {
			s.log.Info("reload: API keys replaced", "keys", len(keys), "keys_file", cfg.Auth.KeysFile)
		}
	}
	s.cfg.Auth, s.cfg.Callers = cfg.Auth, cfg.Callers
	s.ln.SetTrustedProxies(s.trustedProxies())
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

// reloadCallers applies the callers section of a config read again.
func (s *Server) reloadCallers(next *config.Callers) error {
	switch old := s.cfg.Callers; {
	case old == nil && next == nil:
		return nil
	case old == nil || next == nil:
		s.log.Warn("reload: turning caller quotas on or off needs a restart; the callers section is ignored")
		return nil
	}
	if err := s.api.SetCallers(CallerPolicy(next)); err != nil {
		return err
	}
	s.log.Info("reload: caller quotas replaced", "plans", len(next.Plans), "per_ip", next.PerIP.Limit)
	return nil
}
