package dispatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/clock"
)

// TargetConfig says where a lane's jobs go: exactly one of HTTP, NATS and
// Handler is set.
type TargetConfig struct {
	HTTP *HTTPConfig
	// SigningSecrets sign HTTP deliveries (Standard Webhooks); empty signs
	// nothing.
	SigningSecrets []string
	NATS           *NATSConfig
	// Handler is an in-process target (library use).
	Handler Target
}

// ErrNoTarget is returned by Open for a TargetConfig with no target set.
var ErrNoTarget = errors.New("dispatch: no target configured")

// Open builds the target cfg describes. An HTTP target's URL is checked
// against guard now (a host that resolves to a refused address fails at
// start, not at the first delivery); a NATS target sends through nc. close
// releases what the target holds (idle connections); it is never nil.
// Errors name the part of cfg that is wrong, in the words of the config
// file (target.http.url, target.nats, ...).
func Open(ctx context.Context, cfg TargetConfig, guard *Guard, nc *nats.Conn) (t Target, close func(), err error) {
	nop := func() {}
	switch {
	case cfg.HTTP != nil:
		if err := guard.CheckURL(ctx, cfg.HTTP.URL); err != nil {
			return nil, nop, fmt.Errorf("target.http.url: %w", err)
		}
		hc := *cfg.HTTP
		if len(cfg.SigningSecrets) > 0 {
			signer, err := NewSigner(cfg.SigningSecrets, clock.Real)
			if err != nil {
				return nil, nop, fmt.Errorf("target.http.signing_secrets: %w", err)
			}
			hc.Signing = signer
		}
		h, err := NewHTTP(hc, guard)
		if err != nil {
			return nil, nop, fmt.Errorf("target.http: %w", err)
		}
		return h, h.Close, nil
	case cfg.NATS != nil:
		n, err := NewNATS(nc, *cfg.NATS)
		if err != nil {
			return nil, nop, fmt.Errorf("target.nats: %w", err)
		}
		return n, nop, nil
	case cfg.Handler != nil:
		return cfg.Handler, nop, nil
	}
	return nil, nop, ErrNoTarget
}
