package dispatch

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/clock"
)

// Standard Webhooks header names (https://www.standardwebhooks.com).
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// secretPrefix starts every signing secret in the Standard Webhooks form:
// "whsec_" followed by the standard base64 of the key.
const secretPrefix = "whsec_"

// Key sizes the Standard Webhooks spec asks for, in bytes.
const (
	minSecretBytes = 24
	maxSecretBytes = 64
)

// secretForm says what a signing secret looks like; every refusal ends
// with it.
const secretForm = "expected whsec_ followed by the standard base64 (with = padding) of 24 to 64 random bytes"

// ErrBadSecret matches every refused signing secret (ParseSigningSecret,
// NewSigner); the wrapping error says what is wrong, never the secret.
var ErrBadSecret = errors.New("dispatch: bad signing secret")

// secretError is the error of ParseSigningSecret: it matches ErrBadSecret
// and has no package prefix, so that a config error can show it after the
// field name.
type secretError struct{ msg string }

func (e *secretError) Error() string        { return e.msg + "; " + secretForm }
func (e *secretError) Is(target error) bool { return target == ErrBadSecret }

// ParseSigningSecret returns the key of a signing secret in the Standard
// Webhooks form: "whsec_" followed by the standard base64 (padded) of 24 to
// 64 bytes. Anything else is refused with an error that matches
// ErrBadSecret, says what is wrong and what is expected, and does not
// repeat the secret.
func ParseSigningSecret(secret string) ([]byte, error) {
	b64, ok := strings.CutPrefix(secret, secretPrefix)
	switch {
	case secret == "":
		return nil, &secretError{"empty"}
	case !ok:
		return nil, &secretError{"does not start with whsec_"}
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	// The decoder skips newlines and accepts non-zero padding bits:
	// only the canonical encoding of the key is the key's form.
	if err != nil || base64.StdEncoding.EncodeToString(key) != b64 {
		return nil, &secretError{"the part after whsec_ is not standard base64"}
	}
	if n := len(key); n < minSecretBytes || n > maxSecretBytes {
		return nil, &secretError{fmt.Sprintf("the key is %d bytes", n)}
	}
	return key, nil
}

// Signer signs webhook deliveries per Standard Webhooks: the signed content
// is id + "." + timestamp + "." + body, the signature HMAC-SHA256 with each
// secret, sent as "v1,<base64>" entries separated by spaces (several
// secrets let a receiver rotate keys without a gap). A Signer is immutable
// and safe for concurrent use; a nil *Signer signs nothing.
type Signer struct {
	keys  [][]byte
	clock clock.Clock
}

// NewSigner returns a Signer for secrets, each in the form
// ParseSigningSecret takes. c gives the timestamp (only Now is used); nil
// means clock.Real. An error matches ErrBadSecret and names the secret's
// index.
func NewSigner(secrets []string, c clock.Clock) (*Signer, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secrets", ErrBadSecret)
	}
	if c == nil {
		c = clock.Real
	}
	s := &Signer{clock: c, keys: make([][]byte, 0, len(secrets))}
	for i, sec := range secrets {
		key, err := ParseSigningSecret(sec)
		if err != nil {
			return nil, fmt.Errorf("%w: secrets[%d]: %v", ErrBadSecret, i, err)
		}
		s.keys = append(s.keys, key)
	}
	return s, nil
}

// Sign returns the webhook-id, webhook-timestamp and webhook-signature
// headers for a message with this id and body, timestamped now.
func (s *Signer) Sign(id string, body []byte) http.Header {
	if s == nil {
		return nil
	}
	return s.SignAt(id, s.clock.Now(), body)
}

// SignAt is Sign with an explicit timestamp (truncated to Unix seconds).
func (s *Signer) SignAt(id string, at time.Time, body []byte) http.Header {
	if s == nil {
		return nil
	}
	ts := strconv.FormatInt(at.Unix(), 10)
	var sig strings.Builder
	for i, key := range s.keys {
		if i > 0 {
			sig.WriteByte(' ')
		}
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id))
		mac.Write([]byte{'.'})
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		sig.WriteString("v1,")
		sig.WriteString(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	h := make(http.Header, 3)
	h.Set(HeaderWebhookID, id)
	h.Set(HeaderWebhookTimestamp, ts)
	h.Set(HeaderWebhookSignature, sig.String())
	return h
}
