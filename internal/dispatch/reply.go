package dispatch

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// A pull-mode worker names the subject the throttler answers it on (the
// reply subject of its pull request, or of an outcome report): a subject a
// client chooses. The throttler publishes there only when it is inside a
// worker's own inbox, _INBOX.<worker user>.…, for a worker user allowed on
// the lane; never on the JetStream or KV API ($JS.…, $KV.…), the
// throttler's own subjects (throttler.control.<lane>), another client's
// inbox, or a wildcard.

// WorkerInboxRoot is the first token of a worker's inbox prefix:
// _INBOX.<user> (nats.CustomInboxPrefix; the nats CLI's --inbox-prefix).
const WorkerInboxRoot = "_INBOX"

// MaxReplyLen bounds a reply subject the throttler answers on.
const MaxReplyLen = 256

// ErrReplyRefused: a reply subject is not inside the inbox of a worker
// allowed on the lane. The throttler neither answers on it nor hands a job
// to it.
var ErrReplyRefused = errors.New("dispatch: pull: reply subject refused")

// Reasons a reply subject is refused, the values of the "reason" label of
// throttler_pull_replies_refused_total.
const (
	// ReplyMalformed: empty, too long, a wildcard, an empty token, a
	// token starting with '$', or a byte outside printable ASCII.
	ReplyMalformed = "malformed"
	// ReplyNotInbox: not under _INBOX.<user>. with a token after it.
	ReplyNotInbox = "not_inbox"
	// ReplyNotWorker: the inbox of a user that is not a worker of the lane.
	ReplyNotWorker = "not_worker"
)

// ReplyError says why a reply subject was refused; it is ErrReplyRefused.
type ReplyError struct {
	// Reason is one of ReplyMalformed, ReplyNotInbox, ReplyNotWorker.
	Reason string
	Msg    string
}

func (e *ReplyError) Error() string { return ErrReplyRefused.Error() + ": " + e.Msg }

// Is makes a ReplyError ErrReplyRefused.
func (e *ReplyError) Is(target error) bool { return target == ErrReplyRefused }

// CheckReply returns the worker user whose inbox reply is in, or a
// *ReplyError. reply must be made of printable ASCII with no wildcard, no
// empty token and no token starting with '$', at most MaxReplyLen bytes.
// With workers given, it must be _INBOX.<user>.<token>[.<token>…] with
// user one of them; with none (a setup that names no worker users: anyone
// who can publish on the work subject is a worker), _INBOX.<token>[…] of
// any user, a client's default inbox included.
func CheckReply(reply string, workers []string) (user string, err error) {
	refuse := func(reason, format string, a ...any) (string, error) {
		return "", &ReplyError{Reason: reason, Msg: fmt.Sprintf(format, a...)}
	}
	if reply == "" || len(reply) > MaxReplyLen {
		return refuse(ReplyMalformed, "a reply subject is 1 to %d bytes, not %d", MaxReplyLen, len(reply))
	}
	for i := 0; i < len(reply); i++ {
		if c := reply[i]; c <= ' ' || c >= 0x7f || c == '*' || c == '>' {
			return refuse(ReplyMalformed, "byte %#x at %d is a wildcard, a space or not printable ASCII", c, i)
		}
	}
	tokens := strings.Split(reply, ".")
	for _, tok := range tokens {
		if tok == "" {
			return refuse(ReplyMalformed, "empty token")
		}
		if tok[0] == '$' {
			return refuse(ReplyMalformed, "a token starts with '$'")
		}
	}
	// A named worker's inbox is _INBOX.<user>.>, which _INBOX.<user> itself
	// is not in; with no worker named, a client's default inbox,
	// _INBOX.<random>, is its own.
	minTokens := 3
	if len(workers) == 0 {
		minTokens = 2
	}
	if tokens[0] != WorkerInboxRoot || len(tokens) < minTokens {
		return refuse(ReplyNotInbox, "not inside a worker's inbox %s.<user>.", WorkerInboxRoot)
	}
	user = tokens[1]
	if len(workers) > 0 && !slices.Contains(workers, user) {
		return refuse(ReplyNotWorker, "%s.%s is not the inbox of a worker of this lane", WorkerInboxRoot, user)
	}
	return user, nil
}
