package records

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/throttler/throttler/api"
)

// Where a settled record is published on NATS (core NATS, after the write
// that settled it):
//
//   - always, for a lane that keeps records, on the throttler's own results
//     subject throttler.results.<lane>.<token> (ResultsSubject), which a
//     publisher subscribes to before it publishes;
//   - once more on the job's Throttle-Reply subject, when a job published
//     over NATS names one and its lane lists results.reply_subjects
//     prefixes it is under (Replies.Check).
//
// Only the throttler publishes under throttler.> (docs/OPERATIONS.md), so a
// record heard on the results subject is the throttler's. A reply subject
// is chosen by whoever may publish on the lane's public subject, and the
// throttler cannot tell which NATS user that was: it publishes there only
// under a prefix the operator listed for the lane, and never on a subject
// of its own, of the server, or of a worker's inbox.

// HeaderReply is the header a job published over NATS names its reply
// subject in.
const HeaderReply = "Throttle-Reply"

// ResultsPrefix starts the results subjects (api.ResultsPrefix).
const ResultsPrefix = api.ResultsPrefix

// ResultsSubject is the subject job id's settled record of lane is
// published on (api.ResultsSubject).
func ResultsSubject(lane, id string) string { return api.ResultsSubject(lane, id) }

// MaxReplyLen bounds a reply subject.
const MaxReplyLen = 256

// ErrReplyRefused: a reply subject the throttler will not publish on.
var ErrReplyRefused = errors.New("reply subject refused")

// ReplyError says why a reply subject (or a results.reply_subjects prefix)
// is refused; it is ErrReplyRefused.
type ReplyError struct{ Msg string }

func (e *ReplyError) Error() string { return ErrReplyRefused.Error() + ": " + e.Msg }

// Is makes a ReplyError ErrReplyRefused.
func (e *ReplyError) Is(target error) bool { return target == ErrReplyRefused }

func refuse(format string, a ...any) error { return &ReplyError{Msg: fmt.Sprintf(format, a...)} }

// ownRoots are first tokens no reply subject may have: the throttler's
// intake, its own subjects, its retry and dead-letter streams, its inbox.
// A token starting with '$' ($JS, $KV, $SYS, …) is refused on its own.
var ownRoots = []string{"throttle", "throttler", "throttle_retry", "throttle_dead", "_INBOX_throttler"}

// inboxRoot is the first token of a client's inbox (_INBOX.<user>.…).
const inboxRoot = "_INBOX"

// Replies are the reply subjects one lane may use: under its
// results.reply_subjects prefixes, outside every worker's inbox. The zero
// value (or nil) refuses every subject. Safe for concurrent use (read only).
type Replies struct {
	prefixes []string
	// workers are the named worker users of every pull-mode lane: their
	// inboxes _INBOX.<worker>.… are refused.
	workers []string
	// anyInbox: a pull-mode lane names no worker user, so any _INBOX.… may
	// be a worker's: every inbox is refused.
	anyInbox bool
}

// ReplyRules are what a lane's Replies are made of.
type ReplyRules struct {
	// Prefixes are the lane's results.reply_subjects.
	Prefixes []string
	// Workers are the worker users of every pull-mode lane of the
	// instance, by lane (config.NATS.WorkersOf): a lane listed with no
	// user answers any inbox, so every _INBOX.… is refused.
	Workers map[string][]string
}

// PrefixError says which results.reply_subjects prefix is refused, and
// why; it unwraps to a *ReplyError.
type PrefixError struct {
	Index int
	Err   error
}

func (e *PrefixError) Error() string { return fmt.Sprintf("[%d]: %v", e.Index, e.Err) }

// Unwrap returns the reason.
func (e *PrefixError) Unwrap() error { return e.Err }

// NewReplies checks every prefix and returns the rules; a refused prefix is
// a *PrefixError.
func NewReplies(r ReplyRules) (*Replies, error) {
	out := &Replies{prefixes: slices.Clone(r.Prefixes)}
	for _, ws := range r.Workers {
		if len(ws) == 0 {
			out.anyInbox = true
		}
		out.workers = append(out.workers, ws...)
	}
	for i, p := range r.Prefixes {
		if err := out.checkPrefix(p); err != nil {
			return nil, &PrefixError{Index: i, Err: err}
		}
	}
	return out, nil
}

// checkPrefix refuses a prefix that is not a literal subject, or under which
// no subject could pass (it is forbidden itself).
func (r *Replies) checkPrefix(p string) error {
	if strings.HasSuffix(p, ".") || strings.HasSuffix(p, ".>") || p == ">" {
		return refuse("%q: write a prefix as a subject without a trailing '.' or wildcard (replies.shop covers replies.shop and replies.shop.>)", p)
	}
	if err := r.forbidden(p); err != nil {
		return err
	}
	if r.anyInbox && p == inboxRoot {
		return refuse("%q: a pull-mode lane names no worker user, so every %s.… may be a worker's inbox", p, inboxRoot)
	}
	return nil
}

// forbidden checks what holds for any subject the throttler publishes a
// reply on, whatever the prefixes.
func (r *Replies) forbidden(s string) error {
	if s == "" || len(s) > MaxReplyLen {
		return refuse("a reply subject is 1 to %d bytes, not %d", MaxReplyLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '*' || c == '>' {
			return refuse("byte %#x at %d is a wildcard, a space or not printable ASCII", c, i)
		}
	}
	tokens := strings.Split(s, ".")
	for _, tok := range tokens {
		if tok == "" {
			return refuse("%q has an empty token", s)
		}
		if tok[0] == '$' {
			return refuse("%q has a token starting with '$' (the server's $JS, $KV, $SYS…)", s)
		}
	}
	if slices.Contains(ownRoots, tokens[0]) {
		return refuse("%q is under %s., the throttler's own", s, tokens[0])
	}
	if tokens[0] == inboxRoot && len(tokens) > 1 {
		if r.anyInbox {
			return refuse("%q is under %s.: a pull-mode lane names no worker user, so any inbox may be a worker's", s, inboxRoot)
		}
		if slices.Contains(r.workers, tokens[1]) {
			return refuse("%q is inside the inbox of worker %s", s, tokens[1])
		}
	}
	return nil
}

// Check returns nil when the throttler may publish a record on subject s:
// printable ASCII, at most MaxReplyLen bytes, no wildcard, no empty token,
// no token starting with '$', not under throttle., throttler.,
// throttle_retry., throttle_dead., _INBOX_throttler. or a worker's inbox,
// and under one of the lane's prefixes at a token boundary (the prefix
// itself or prefix.…). Otherwise a *ReplyError.
func (r *Replies) Check(s string) error {
	if r == nil || len(r.prefixes) == 0 {
		return refuse("the lane lists no results.reply_subjects")
	}
	if err := r.forbidden(s); err != nil {
		return err
	}
	for _, p := range r.prefixes {
		if s == p || strings.HasPrefix(s, p) && s[len(p)] == '.' {
			return nil
		}
	}
	return refuse("%q is under none of the lane's results.reply_subjects", s)
}
