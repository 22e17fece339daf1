package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/queue"
)

// KeyDirectory reads and changes one key of a keyed lane
// (GET|PATCH /v1/lanes/{lane}/keys/{key}). Its errors: ErrNotKeyed for a
// lane without per_key, a *bucket.LimitError (or bucket.ErrInvalidLimit)
// for a refused change, anything else means the change could not be stored.
type KeyDirectory interface {
	KeyStatus(ctx context.Context, lane, key string) (api.KeyStatus, error)
	SetKey(ctx context.Context, lane, key string, c KeyChange, by string) (api.KeyStatus, error)
}

// ErrNotKeyed is what a KeyDirectory answers for a lane without per_key:
// api.ErrNotKeyed, which the lanes answer too.
var ErrNotKeyed = api.ErrNotKeyed

// KeyChange is the body of PATCH /v1/lanes/{lane}/keys/{key}: absent fields
// keep their value; "reset": true first drops the key's override.
type KeyChange struct {
	Rate        *bucket.Rate `json:"rate"`
	Burst       *int         `json:"burst"`
	MaxInflight *int         `json:"max_inflight"`
	Weight      *float64     `json:"weight"`
	Paused      *bool        `json:"paused"`
	// URL, Headers and SigningSecret give the key its own target on an
	// HTTP lane: a URL under target.http.job_urls, headers the lane
	// forwards, a Standard Webhooks secret (write-only). "" or {} drops
	// one.
	URL           *string           `json:"url"`
	Headers       map[string]string `json:"headers"`
	SigningSecret *string           `json:"signing_secret"`
	Reset         bool              `json:"reset"`
}

func (h *Handler) routeKeys() {
	if h.cfg.Keys == nil {
		return
	}
	h.mux.HandleFunc("GET /v1/lanes/{lane}/keys/{key}", h.authorize(needRead, h.admin(h.getKey)))
	h.mux.HandleFunc("PATCH /v1/lanes/{lane}/keys/{key}", h.authorize(needAdmin, h.admin(h.setKey)))
}

func pathKey(r *http.Request) (string, error) {
	key := r.PathValue("key")
	if err := queue.ValidKey(key); err != nil {
		return "", &Refusal{Err: ErrBadParam, Cause: err, Field: "key", Detail: "key: " + err.Error()}
	}
	return key, nil
}

// keyRefusal is a KeyDirectory's error as the API answers it: the lane has
// no keys, the change was refused (its field named), or it could not be
// stored.
func keyRefusal(err error) error {
	if errors.Is(err, ErrNotKeyed) {
		return refusalOf(err, "the lane has no per_key block: it has no keys")
	}
	if errors.Is(err, bucket.ErrInvalidLimit) {
		return err
	}
	var de *dest.Error
	if errors.As(err, &de) {
		// The key's url, headers or signing_secret, refused by the lane's
		// lists: the body member at fault (its text holds no value).
		return &Refusal{Err: ErrBadBody, Cause: err, Field: de.Field, Detail: de.Error()}
	}
	return refusalOf(err, "the change could not be stored: %v", err)
}

func (h *Handler) getKey(w http.ResponseWriter, r *http.Request, lane string) error {
	key, err := pathKey(r)
	if err != nil {
		return err
	}
	st, err := h.cfg.Keys.KeyStatus(r.Context(), lane, key)
	if err != nil {
		return keyRefusal(err)
	}
	if s, ok := r.Context().Value(scopesCtx{}).(Scopes); ok && !s.Admin {
		// A receiver's token may sit in the URL's query; the admin who
		// set it sees it whole.
		st.URL = hideQuery(st.URL)
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (h *Handler) setKey(w http.ResponseWriter, r *http.Request, lane string) error {
	key, err := pathKey(r)
	if err != nil {
		return err
	}
	var c KeyChange
	if err := h.readSmall(w, r, &c, "a JSON object with rate, burst, max_inflight, weight, paused, url, headers, signing_secret and/or reset"); err != nil {
		return err
	}
	if c.Rate == nil && c.Burst == nil && c.MaxInflight == nil && c.Weight == nil && c.Paused == nil &&
		c.URL == nil && c.Headers == nil && c.SigningSecret == nil && !c.Reset {
		return refusal(ErrBadBody, "body", "nothing to change: give rate, burst, max_inflight, weight, paused, url, headers, signing_secret or reset")
	}
	old, _ := h.cfg.Keys.KeyStatus(r.Context(), lane, key)
	st, err := h.cfg.Keys.SetKey(r.Context(), lane, key, c, callerOf(r))
	if err != nil {
		return keyRefusal(err)
	}
	h.audit(r, "key limit changed", "set_key", lane, "key", key,
		"old", fmt.Sprintf("rate=%v burst=%d max_inflight=%d weight=%v paused=%v", old.Rate, old.Burst, old.MaxInflight, old.Weight, old.Paused),
		"rate", st.Rate, "burst", st.Burst, "max_inflight", st.MaxInflight, "weight", st.Weight, "paused", st.Paused, "overridden", st.Overridden,
		// Where the key's jobs go: whether a URL and secret are set and
		// the header names; values may hold credentials.
		"url_set", st.URL != "", "headers", st.Headers, "signing_secret_set", st.SigningSecretSet)
	writeJSON(w, http.StatusOK, st)
	return nil
}
