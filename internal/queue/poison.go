package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Poison jobs: a job published on a lane's public subject that can never be
// delivered as it is. It goes to the dead letters at once, with the reason,
// before it takes a slot or an attempt: retried, it would fail the same way
// every time, and at the head of a keyed lane's intake stream it would hold
// every job behind it.
//
// What makes a public job poison, on plain and keyed lanes alike:
//
//   - a key the key rules refuse (ValidKey): the key is passed to the target
//     as Throttle-Key, and a byte such as 0x7f makes that header invalid;
//   - on a keyed lane, no key at all (published on throttle.<lane>), unless
//     the lane takes keys from URL hosts (LaneSpec.URLKey) and the job names
//     a Throttle-URL: then a URL the lane's job_urls refuse, or a key
//     token that is not the URL's host (urlKey); on such a lane, a key
//     token and no Throttle-URL, unless the key has its own url or is the
//     host of the lane's url (LaneSpec.KeyWithoutURL);
//   - a Throttle-Delay, Throttle-Not-Before or Throttle-Expires that
//     cannot be used (ParseSchedule, counted from when the job was stored);
//   - a payload over the lane's max_body: the stream leaves HeaderRoom for
//     the publisher's headers, so such a payload is stored, but a copy of it
//     with the throttler's own headers (a retry, a move onto its key) may
//     not fit the server's max_payload.
//
// A bad Nats-Msg-Id or Content-Type does not make a job poison: the job
// gets the id <lane>-<sequence> and no Content-Type instead, as documented.

// poisonRetry is how long a poison job waits before its dead letter is
// tried again, when it could not be stored.
const poisonRetry = 5 * time.Second

// maxLoggedSubject bounds the part of a poison job's subject that is logged.
const maxLoggedSubject = 256

// poisonReason says why a job published on one of lane's public subjects
// can never be delivered, or "" when it can. keyed says the lane is keyed.
func poisonReason(spec LaneSpec, job Job, keyed bool) string {
	if spec.CallbacksOnly {
		return "the lane is a results.callback_lane: it carries other lanes' callbacks, signed as their settled records, and takes no job published on throttle." + spec.Name
	}
	switch kerr := ValidKey(job.Key); {
	case keyed && job.Key == "" && spec.URLKey != nil:
		return "no Throttle-Key: a keyed lane's jobs are published on throttle." + spec.Name + ".<key>, or on throttle." + spec.Name +
			" with a Throttle-URL whose host is the key (per_key.key_from url_host)"
	case keyed && job.Key == "":
		return "no Throttle-Key: a keyed lane's jobs are published on throttle." + spec.Name + ".<key>"
	case job.Key != "" && kerr != nil:
		return "invalid Throttle-Key: " + kerr.Error()
	}
	var se *ScheduleError
	if errors.As(job.ScheduleErr, &se) {
		return "invalid " + se.Header() + ": " + se.Msg
	}
	if mb := spec.MaxBody; mb > 0 && int64(len(job.Payload)) > mb {
		return fmt.Sprintf("payload too large: %d bytes, over the lane's max_body of %d", len(job.Payload), mb)
	}
	return ""
}

// urlKey gives job, published on a public subject of a url_host lane
// (spec.URLKey), the key of its Throttle-URL, or says why it is poison: a
// URL the lane refuses, a key token other than the URL's host, or a key
// token and no URL that spec.KeyWithoutURL refuses. A job without a URL
// keeps its subject's key (none makes it poison below).
func urlKey(spec LaneSpec, job *Job) string {
	if spec.URLKey == nil {
		return ""
	}
	if job.Dest.URL == "" {
		if job.Key == "" || ValidKey(job.Key) != nil || spec.KeyWithoutURL == nil {
			return "" // poisonReason says why, if it is poison
		}
		if err := spec.KeyWithoutURL(job.Key); err != nil {
			return "Throttle-Key " + err.Error()
		}
		return ""
	}
	key, err := spec.URLKey(job.Dest.URL)
	switch {
	case err != nil:
		// dest's errors name the header and never hold its value.
		return "invalid " + err.Error()
	case job.Key != "" && job.Key != key:
		if ValidKey(job.Key) != nil {
			return "" // poisonReason says why
		}
		return fmt.Sprintf("Throttle-Key %q is not the host of its Throttle-URL (%q): the lane takes a job's key from its URL's host (per_key.key_from url_host)", job.Key, key)
	}
	job.Key = key
	return ""
}

// replayKeyReason gives job, a dead letter's job about to be replayed on
// lane spec (keyed says the lane is keyed), the key the lane's key rules
// give it, or says why it could never be delivered there: the rules of a
// public job's key (urlKey, and the key part of poisonReason), phrased for
// a job that is no longer on a subject. Without this check such a job is
// stored on a subject the keyed reader never reads (a keyless one, or one
// with a key ValidKey refuses) and stays there, never delivered.
func replayKeyReason(spec LaneSpec, job *Job, keyed bool) string {
	if reason := urlKey(spec, job); reason != "" {
		return reason
	}
	switch kerr := ValidKey(job.Key); {
	case keyed && job.Key == "" && spec.URLKey != nil:
		return "the job has no Throttle-Key and no Throttle-URL whose host would be its key; lane " + spec.Name + " is keyed (per_key.key_from url_host)"
	case keyed && job.Key == "":
		return "the job has no Throttle-Key; lane " + spec.Name + " is keyed"
	case job.Key != "" && kerr != nil:
		return fmt.Sprintf("the job's Throttle-Key %s is not a valid key (%v)", escapeBytes(job.Key[:min(len(job.Key), 2*MaxKey)]), kerr)
	}
	return ""
}

// deadPoison dead-letters m, a poison job, with reason. The dead letter
// must fit the server's max_payload (max_body plus HeaderRoom, as the
// embedded server is started), or the job would come back forever: its
// payload is cut at max_body, and an invalid key at MaxKey bytes with every
// byte outside visible ASCII written \xNN (a header value keeps it
// readable and whole).
func (q *Queue) deadPoison(ctx context.Context, m *Msg, spec LaneSpec, reason string, subject string) error {
	job := &m.job
	if mb := spec.MaxBody; mb > 0 && int64(len(job.Payload)) > mb {
		reason += fmt.Sprintf("; the dead letter keeps the payload's first %d of %d bytes", mb, len(job.Payload))
		job.Payload = job.Payload[:mb]
	}
	if ValidKey(job.Key) != nil && job.Key != "" {
		if len(job.Key) > MaxKey {
			reason += fmt.Sprintf("; the dead letter keeps the key's first %d of %d bytes", MaxKey, len(job.Key))
			job.Key = job.Key[:MaxKey]
		}
		job.Key = escapeBytes(job.Key)
	}
	if err := m.Dead(ctx, DeadInfo{Reason: reason}, poisonRetry); err != nil {
		q.log.Warn("dead-lettering a poison job failed; trying again", "lane", spec.Name, "seq", m.Seq(), "reason", reason, "err", err)
		return err
	}
	if ls, err := q.lane(spec.Name); err == nil {
		ls.mu.Lock()
		f := ls.onPoison
		ls.mu.Unlock()
		if f != nil {
			f()
		}
	}
	q.log.Warn("public job dead-lettered", "lane", spec.Name, "seq", m.Seq(), "subject", escapeBytes(subject[:min(len(subject), maxLoggedSubject)]), "reason", reason)
	return nil
}

// maxStranded bounds the stranded jobs one deadStranded call
// dead-letters; the next sweep takes more.
const maxStranded = 100

// deadStranded dead-letters the jobs a keyed lane's stream holds on
// subjects, internal subjects of the lane that no key reads: the lane's
// keyless subject, or a key ValidKey refuses. Only a replay of a dead
// letter of an earlier version stored jobs there (ReplayDead now refuses
// such a replay); stranded, they would never be delivered nor dead-lettered,
// and would count against the backlog. A subject with a wildcard token is
// passed over: a read of it would match other keys' jobs. Failures are
// logged; the next sweep tries again. Two instances sweeping at once store
// one dead letter (its msg id is the message's).
func (q *Queue) deadStranded(ctx context.Context, ls *laneState, subjects []string) {
	lane := ls.spec.Name
	src := origin(StreamName(lane), ls.epoch)
	n := 0
	for _, subj := range subjects {
		internal, key, ok := subjectKey(lane, subj)
		if !ok || !internal || slices.ContainsFunc(strings.Split(subj, "."), func(t string) bool { return t == "*" || t == ">" }) {
			continue
		}
		for from := uint64(1); n < maxStranded; n++ {
			gctx, cancel := context.WithTimeout(ctx, getTimeout)
			raw, err := ls.stream.GetMsg(gctx, from, jetstream.WithGetMsgSubject(subj))
			cancel()
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				q.log.Warn("reading a stranded job of a keyed lane failed", "lane", lane, "err", err)
				return
			}
			from = raw.Sequence + 1
			if raw.Header.Get(headerClaim) != "" {
				// A delayed job's claim on its id (schedule.go) whose
				// delete failed or is under way: no job. Its msg id stays
				// remembered by the stream once it is gone.
				if err := ls.stream.DeleteMsg(ctx, raw.Sequence); err != nil && !gone(err) {
					q.log.Warn("deleting a delayed job's claim failed", "lane", lane, "seq", raw.Sequence, "err", err)
				}
				continue
			}
			job := decodeJob(lane, raw.Header, raw.Data, key, raw.Sequence, true, time.Now())
			reason := "stored with no key on keyed lane " + lane + ", whose jobs are read by key: never delivered (a dead letter replayed without a key)"
			if key != "" {
				reason = "stored under a key the keyed lane's key rules refuse: never delivered (a dead letter replayed with that key)"
			}
			meta := &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: raw.Sequence}, NumDelivered: 1, Timestamp: raw.Time}
			m := &Msg{job: job, m: &deleteAck{st: ls.stream, seq: raw.Sequence}, meta: meta, origin: src,
				c: &Consumer{q: q, lane: lane, outstanding: map[*Msg]time.Time{}}}
			dctx, cancel := context.WithTimeout(ctx, 2*publishTimeout)
			err = q.deadPoison(dctx, m, ls.spec, reason, subj)
			cancel()
			if err != nil && !errors.Is(err, ErrAckUnconfirmed) {
				return // logged; the next sweep tries again
			}
		}
	}
}

// OnPoison registers f to hear every poison job of lane dead-lettered
// (the lane counts them with its own dead letters). f must be cheap and
// must not block.
func (q *Queue) OnPoison(lane string, f func()) {
	ls, err := q.lane(lane)
	if err != nil {
		return
	}
	ls.mu.Lock()
	ls.onPoison = f
	ls.mu.Unlock()
}

// escapeBytes writes every byte of s outside visible ASCII as \xNN, and a
// backslash as \\.
func escapeBytes(s string) string {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '\\' {
			b := make([]byte, 0, len(s)+8)
			b = append(b, s[:i]...)
			for ; i < len(s); i++ {
				switch c := s[i]; {
				case c == '\\':
					b = append(b, '\\', '\\')
				case c <= ' ' || c > '~':
					b = append(b, '\\', 'x', hex[c>>4], hex[c&15])
				default:
					b = append(b, c)
				}
			}
			return string(b)
		}
	}
	return s
}
