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
)

// Standard Webhooks header names (https://www.standardwebhooks.com).
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// secretPrefix marks a secret given in the Standard Webhooks form:
// "whsec_" followed by the base64 of the key.
const secretPrefix = "whsec_"

// ErrBadSecret is returned by NewSigner for an unusable secret; the wrapping
// error names the secret's index.
var ErrBadSecret = errors.New("dispatch: bad signing secret")

// Signer signs webhook deliveries per Standard Webhooks: the signed content
// is id + "." + timestamp + "." + body, the signature HMAC-SHA256 with each
// secret, sent as "v1,<base64>" entries separated by spaces (several
// secrets let a receiver rotate keys without a gap). A Signer is immutable
// and safe for concurrent use; a nil *Signer signs nothing.
type Signer struct {
	keys [][]byte
	now  func() time.Time
}

// NewSigner returns a Signer for secrets, each either "whsec_<base64>" (the
// spec's form: the key is the decoded bytes) or used as raw key bytes.
// The spec recommends keys of 24 to 64 random bytes. now gives the
// timestamp; nil means time.Now.
func NewSigner(secrets []string, now func() time.Time) (*Signer, error) {
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secrets", ErrBadSecret)
	}
	if now == nil {
		now = time.Now
	}
	s := &Signer{now: now, keys: make([][]byte, 0, len(secrets))}
	for i, sec := range secrets {
		key, err := decodeSecret(sec)
		if err != nil {
			return nil, fmt.Errorf("%w: secrets[%d]: %v", ErrBadSecret, i, err)
		}
		s.keys = append(s.keys, key)
	}
	return s, nil
}

// decodeSecret turns one configured secret into key bytes.
func decodeSecret(sec string) ([]byte, error) {
	if sec == "" {
		return nil, errors.New("empty")
	}
	b64, ok := strings.CutPrefix(sec, secretPrefix)
	if !ok {
		return []byte(sec), nil
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		// Some generators drop the padding.
		var rawErr error
		if key, rawErr = base64.RawStdEncoding.DecodeString(b64); rawErr != nil {
			return nil, fmt.Errorf("%s value is not valid base64: %v", secretPrefix, err)
		}
	}
	if len(key) == 0 {
		return nil, fmt.Errorf("%s value is empty", secretPrefix)
	}
	return key, nil
}

// Sign returns the webhook-id, webhook-timestamp and webhook-signature
// headers for a message with this id and body, timestamped now.
func (s *Signer) Sign(id string, body []byte) http.Header {
	if s == nil {
		return nil
	}
	return s.SignAt(id, s.now(), body)
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
