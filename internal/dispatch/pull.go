package dispatch

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
)

// The pull protocol (docs/WORKERS.md; its wire names are in package api).
// A worker asks for its next job with
// a request to the work subject; an instance holding a paced job answers it
// with the job, whose reply subject (also in api.HeaderAck) is the job's outcome
// subject: <work subject>.ack.<holder>.<token>, with a random token that
// only the worker handed the job learns. The worker reports on it.
const (
	// DefaultLease is PullConfig.Lease's default.
	DefaultLease = 30 * time.Second
	// maxWorkerWait bounds how long a fetched job waits for a worker to
	// ask before it goes back to the queue.
	maxWorkerWait = 5 * time.Second
	// DefaultMaxParked is PullConfig.MaxParked's default.
	DefaultMaxParked = 10_000
	// pullQueue is the queue group of the instances on a work subject.
	pullQueue = "throttler"
	// ackToken is the token between the work subject and an outcome's
	// holder and lease.
	ackToken = "ack"
)

// Errors of pull-mode deliveries.
var (
	// ErrLeaseExpired: the worker handed the job neither reported an
	// outcome nor progress within its lease; the job is retried.
	ErrLeaseExpired = errors.New("dispatch: pull: lease expired")
	// ErrNoWorker: no worker asked for the job in time; it goes back to
	// the queue unstarted.
	ErrNoWorker = errors.New("dispatch: pull: no worker asked for the job")
	// ErrWorkerGone: the worker's inbox had no subscriber when the job
	// was handed over; the job goes back to the queue unstarted.
	ErrWorkerGone = errors.New("dispatch: pull: the worker was gone")
)

// PullConfig configures a pull-mode NATS target.
type PullConfig struct {
	// Subject is the work subject workers send pull requests to. No
	// wildcards.
	Subject string
	// Lease is how long a worker may hold a job without reporting; a
	// "progress" outcome extends it by Lease. 0 means DefaultLease.
	Lease time.Duration
	// MaxParked bounds the pull requests parked at once; one more is
	// answered "empty" at once (its worker asks again). 0 means
	// DefaultMaxParked.
	MaxParked int
	// Logger receives refused outcomes and lost workers; nil discards.
	Logger *slog.Logger
	// Workers are the worker users allowed on the lane: a pull request or
	// an outcome report is answered only on a reply subject inside one of
	// their inboxes, _INBOX.<user>. (CheckReply). None takes the inbox of
	// any user.
	Workers []string
	// Refused, when set, is told each reply subject refused, with its
	// reason (ReplyMalformed, ReplyNotInbox, ReplyNotWorker).
	Refused func(reason string)
}

// Validate returns an error naming the first bad field, or nil.
func (c PullConfig) Validate() error {
	return validateNATSTarget("pull", c.Subject, "Lease", c.Lease)
}

var _ Target = (*Pull)(nil)

// Pull is a NATS target for fixed worker pools: a job is handed to a
// worker only when that worker asks for one, so a busy worker never has
// jobs queued on it while another idles. It is safe for concurrent use;
// it does not own the connection.
//
// Workers park pull requests on the work subject (all instances of the
// throttler share them as a queue group). Deliver hands the job to the
// longest-waiting parked request, then waits for the worker's outcome on
// the job's own outcome subject, bounded by the lease, which "progress"
// reports extend. Outcomes use the request mode's Throttler-Status values
// (done, retry with Retry-After, dead) plus release (unstarted, back at
// once); the lease's random token binds an outcome to the one job it was
// handed with, so a worker cannot settle another worker's job.
type Pull struct {
	nc      *nats.Conn
	subject string
	lease   time.Duration
	log     *slog.Logger
	workers []string
	refused func(reason string)
	// maxParked bounds the pull requests parked (PullConfig.MaxParked).
	maxParked int
	// refusals bounds the log lines of refused reply subjects, and
	// outcomeRefusals those of refused outcomes.
	refusals, outcomeRefusals logBound
	// ackPrefix is <subject>.ack.<holder>: outcomes for this target's
	// leases, and no other instance's.
	ackPrefix string

	mu     sync.Mutex
	parked *list.List // of *parkedPull, oldest first
	// arrived is closed (and replaced) when a pull request is parked.
	arrived chan struct{}
	leases  map[string]*lease
	pullSub *nats.Subscription
	ackSub  *nats.Subscription
	stopped bool
	// claimed counts waiting pull requests that a fetched job is meant
	// for (Claim); never more than the requests waiting.
	claimed int
}

// parkedPull is a worker's pull request waiting for a job.
type parkedPull struct {
	reply  string
	worker string
	// timer answers "empty" when no job came in time; whoever stops it
	// first (take, or the timer itself) owns the request.
	timer *time.Timer
	elem  *list.Element
	at    time.Time // when it was parked
}

// lease is a job handed to a worker, waiting for its outcome.
type lease struct {
	jobID   string
	final   chan Result   // one outcome, buffered
	extend  chan struct{} // progress reports, buffered 1
	settled bool
}

// OpenPull subscribes to cfg.Subject (pull requests) and to this target's
// outcome subjects on nc. StopPulls stops taking pull requests; Close
// releases both subscriptions.
//
// Everything the target sends goes through nc to subjects its workers
// chose: nc should be a connection that may publish to workers' inboxes
// only (docs/OPERATIONS.md, the pull user), so that a reply subject that
// got past CheckReply still could not reach the throttler's own subjects.
func OpenPull(nc *nats.Conn, cfg PullConfig) (*Pull, error) {
	if nc == nil {
		return nil, errors.New("dispatch: pull: nil connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pull{nc: nc, subject: cfg.Subject, lease: cfg.Lease, log: cfg.Logger, parked: list.New(),
		arrived: make(chan struct{}), leases: map[string]*lease{},
		workers: slices.Clone(cfg.Workers), refused: cfg.Refused}
	if p.lease == 0 {
		p.lease = DefaultLease
	}
	if p.maxParked = cfg.MaxParked; p.maxParked <= 0 {
		p.maxParked = DefaultMaxParked
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ackPrefix = AckPrefix(cfg.Subject) + "." + randomToken(8)
	var err error
	if p.ackSub, err = nc.Subscribe(p.ackPrefix+".*", p.onOutcome); err != nil {
		return nil, fmt.Errorf("dispatch: pull: subscribe %s: %w", p.ackPrefix, err)
	}
	if p.pullSub, err = nc.QueueSubscribe(cfg.Subject, pullQueue, p.onPull); err != nil {
		_ = p.ackSub.Unsubscribe()
		return nil, fmt.Errorf("dispatch: pull: subscribe %s: %w", cfg.Subject, err)
	}
	return p, nil
}

// AckPrefix is the prefix of the outcome subjects of a work subject:
// outcomes go to <subject>.ack.<holder>.<token>.
func AckPrefix(subject string) string { return subject + "." + ackToken }

// randomToken returns n random bytes in hex: a capability, never guessable.
func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Lease is the lease of the jobs this target hands out.
func (p *Pull) Lease() time.Duration { return p.lease }

// onPull parks a worker's pull request until a job or its expiry.
func (p *Pull) onPull(m *nats.Msg) {
	if m.Reply == "" || !p.replyOK(m, "pull request") {
		return
	}
	expires := api.DefaultPullExpires
	if v := m.Header.Get(api.HeaderExpires); v != "" {
		ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || ms < 0 {
			p.answer(m.Reply, api.StatusRefused, fmt.Sprintf("%s: %q is not a whole number of milliseconds", api.HeaderExpires, v))
			return
		}
		expires = min(max(time.Duration(ms)*time.Millisecond, api.MinPullExpires), api.MaxPullExpires)
	}
	// Never hand a job out in the last tenth of the wait (at most 1 s):
	// the worker must still be listening when it arrives.
	wait := expires - min(expires/10, time.Second)
	pp := &parkedPull{reply: m.Reply, worker: m.Header.Get(api.HeaderWorker), at: time.Now()}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.parked.Len() >= p.maxParked {
		// Stopping, or more requests parked than any pool needs: each
		// holds a timer and memory until it expires, so a flood of pulls
		// is answered "empty" at once (a worker asks again).
		p.answer(m.Reply, api.StatusEmpty, "")
		return
	}
	pp.elem = p.parked.PushBack(pp)
	pp.timer = time.AfterFunc(wait, func() {
		p.mu.Lock()
		p.removeLocked(pp)
		p.mu.Unlock()
		p.answer(pp.reply, api.StatusEmpty, "")
	})
	// Wake every waiter: the drain's Claim and the deliveries' take.
	close(p.arrived)
	p.arrived = make(chan struct{})
}

// answer replies to a pull request or an outcome with a status only.
func (p *Pull) answer(reply, status, reason string) {
	msg := nats.NewMsg(reply)
	msg.Header.Set(HeaderStatus, status)
	if reason != "" {
		msg.Header.Set(HeaderError, reason)
	}
	_ = p.nc.PublishMsg(msg)
}

// Claim waits until a pull request waits here that no job fetched for
// an earlier one is meant for (or ctx ends), and claims up to max of them:
// the caller fetches that many jobs at most, and Unclaim gives back the
// claims it fetched no job for. Each hand-out uses up one claim; a claim
// never outlives the pull requests waiting, so one whose job went
// elsewhere lapses with them.
func (p *Pull) Claim(ctx context.Context, max int) (int, error) {
	for {
		p.mu.Lock()
		if free := p.parked.Len() - p.claimed; free > 0 {
			n := min(free, max)
			p.claimed += n
			p.mu.Unlock()
			return n, nil
		}
		arrived := p.arrived
		p.mu.Unlock()
		select {
		case <-arrived:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Bounce answers "empty" to the pull requests that have waited here longer
// than d and that no job is meant for (Claim), oldest first, so that their
// workers ask again, maybe at another instance; it returns how many. A
// keyed lane calls it when it has no job due for them: the keys with jobs
// may be held by another instance, whose own workers are elsewhere.
func (p *Pull) Bounce(d time.Duration) int {
	var replies []string
	p.mu.Lock()
	cutoff := time.Now().Add(-d)
	for e := p.parked.Front(); e != nil && p.parked.Len() > p.claimed; e = p.parked.Front() {
		pp := e.Value.(*parkedPull)
		if pp.at.After(cutoff) {
			break
		}
		if pp.timer.Stop() {
			replies = append(replies, pp.reply)
		}
		p.removeLocked(pp)
	}
	p.mu.Unlock()
	for _, r := range replies {
		p.answer(r, api.StatusEmpty, "")
	}
	return len(replies)
}

// Unclaim gives back n claims that no job was fetched for.
func (p *Pull) Unclaim(n int) {
	p.mu.Lock()
	p.claimed = max(p.claimed-n, 0)
	p.mu.Unlock()
}

// removeLocked takes pp out of the waiting requests; claims beyond the
// requests left lapse. p.mu is held.
func (p *Pull) removeLocked(pp *parkedPull) {
	p.parked.Remove(pp.elem)
	p.claimed = min(p.claimed, p.parked.Len())
}

// take pops the oldest parked pull request that has not expired, waiting
// for one up to within (or until ctx ends).
func (p *Pull) take(ctx context.Context, within time.Duration) (*parkedPull, error) {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for e := p.parked.Front(); e != nil; e = p.parked.Front() {
			pp := e.Value.(*parkedPull)
			if pp.timer.Stop() {
				// One claim is used up by this hand-out.
				p.claimed = max(p.claimed-1, 0)
				p.removeLocked(pp)
				p.mu.Unlock()
				return pp, nil
			}
			// Its timer fired and is removing it.
			p.removeLocked(pp)
		}
		arrived := p.arrived
		p.mu.Unlock()
		select {
		case <-arrived:
		case <-deadline.C:
			return nil, ErrNoWorker
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Deliver hands job to the worker that has waited longest for one (waiting
// a few seconds at most for a worker to ask) and waits for its outcome, bounded by
// the lease (extended by progress reports) and by ctx.
func (p *Pull) Deliver(ctx context.Context, job Job) Result {
	return timed(func() Result { return p.deliver(ctx, job) })
}

func (p *Pull) deliver(ctx context.Context, job Job) Result {
	pp, err := p.take(ctx, min(p.lease, maxWorkerWait))
	if err != nil {
		return Result{Verdict: Retry, Unstarted: true, Err: err}
	}
	token := randomToken(16)
	ack := p.ackPrefix + "." + token
	l := &lease{jobID: job.ID, final: make(chan Result, 1), extend: make(chan struct{}, 1)}
	p.mu.Lock()
	p.leases[token] = l
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.leases, token)
		l.settled = true
		p.mu.Unlock()
	}()

	msg := nats.NewMsg(pp.reply)
	msg.Reply = ack
	msg.Data = job.Payload
	msg.Header.Set(HeaderIdempotencyKey, job.ID)
	ct := job.ContentType
	if ct == "" {
		ct = DefaultContentType
	}
	msg.Header.Set("Content-Type", ct)
	msg.Header.Set(HeaderLane, job.Lane)
	if job.Key != "" {
		msg.Header.Set(HeaderKey, job.Key)
		msg.Header.Set(api.HeaderThrottleKey, job.Key)
	}
	msg.Header.Set(HeaderAttempt, strconv.Itoa(job.Attempt))
	msg.Header.Set(api.HeaderAck, ack)
	msg.Header.Set(api.HeaderLease, strconv.FormatInt(p.lease.Milliseconds(), 10))
	setTraceNATS(msg.Header, job.Trace)
	if err := p.nc.PublishMsg(msg); err != nil {
		// Not handed over: back to the queue, nothing counted.
		return Result{Verdict: Retry, Unstarted: true, Err: fmt.Errorf("dispatch: pull %s: hand over: %w", p.subject, err)}
	}
	timer := time.NewTimer(p.lease)
	defer timer.Stop()
	for {
		select {
		case res := <-l.final:
			return res
		case <-l.extend:
			timer.Reset(p.lease)
		case <-timer.C:
			p.log.Warn("worker let its lease expire; the job is retried", "id", job.ID, "worker", pp.worker, "lease", p.lease.String())
			return Result{Verdict: Retry, Err: fmt.Errorf("%w after %v (worker %q)", ErrLeaseExpired, p.lease, pp.worker)}
		case <-ctx.Done():
			return Result{Verdict: Retry, Err: fmt.Errorf("dispatch: pull %s: %w", p.subject, ctx.Err())}
		}
	}
}

// onOutcome applies a worker's report to the lease its subject names. An
// outcome is accepted only for a lease this target handed out and has not
// settled, and (when it carries Idempotency-Key) only for that lease's job.
func (p *Pull) onOutcome(m *nats.Msg) {
	if m.Reply != "" && !p.replyOK(m, "outcome") {
		// Not applied either: a worker that names such a subject is not
		// following the protocol; the lease runs out and the job is
		// retried.
		return
	}
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	p.mu.Lock()
	l := p.leases[token]
	if l != nil && l.settled {
		l = nil
	}
	p.mu.Unlock()
	refuse := func(reason string) {
		if n, ok := p.outcomeRefusals.take(time.Now()); ok {
			p.log.Warn("worker outcome refused", "subject", cut(m.Subject, 256), "reason", cut(reason, 256),
				"id", cut(m.Header.Get(HeaderIdempotencyKey), 128), "status", cut(m.Header.Get(HeaderStatus), 64),
				"refused_since_last_line", n)
		}
		if m.Reply != "" {
			p.answer(m.Reply, api.StatusRefused, reason)
		}
	}
	if l == nil {
		refuse("no such lease: expired, already settled, or never handed out")
		return
	}
	if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
		// The server's no-responders answer: the worker's inbox was gone
		// when the job was handed over. Nothing was started.
		p.finish(l, Result{Verdict: Retry, Unstarted: true, Err: ErrWorkerGone})
		return
	}
	if id := m.Header.Get(HeaderIdempotencyKey); id != "" && id != l.jobID {
		refuse(fmt.Sprintf("the lease is for job %q, not %q", l.jobID, id))
		return
	}
	res, extend, err := ParseOutcome(m.Header)
	if err != nil {
		refuse(err.Error())
		return
	}
	if extend {
		select {
		case l.extend <- struct{}{}:
		default:
		}
	} else if !p.finish(l, res) {
		refuse("no such lease: already settled")
		return
	}
	if m.Reply != "" {
		p.answer(m.Reply, api.StatusAccepted, "")
	}
}

// replyOK reports whether m's reply subject may be answered (CheckReply);
// a refused one is counted and logged, at most one line a second.
func (p *Pull) replyOK(m *nats.Msg, what string) bool {
	_, err := CheckReply(m.Reply, p.workers)
	if err == nil {
		return true
	}
	reason := ReplyMalformed
	var re *ReplyError
	if errors.As(err, &re) {
		reason = re.Reason
	}
	if p.refused != nil {
		p.refused(reason)
	}
	if n, ok := p.refusals.take(time.Now()); ok {
		p.log.Warn("worker reply subject refused; not answered", "what", what, "subject", m.Subject,
			"reply", cut(m.Reply, 128), "reason", reason, "err", cut(err.Error(), 256),
			"worker", cut(m.Header.Get(api.HeaderWorker), 64), "refused_since_last_line", n)
	}
	return false
}

// logBound lets one log line through a second, and counts the rest.
type logBound struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// take reports whether a line may be logged at now, and how many were
// held back since the last one.
func (b *logBound) take(now time.Time) (held int, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() && now.Sub(b.last) < time.Second {
		b.suppressed++
		return 0, false
	}
	held, b.suppressed, b.last = b.suppressed, 0, now
	return held, true
}

// cut returns s cut to at most n bytes, marked with "…" when cut, for
// values a client chose that go into a log line.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// finish hands a lease its one outcome; false if it had one.
func (p *Pull) finish(l *lease, res Result) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.settled {
		return false
	}
	l.settled = true
	l.final <- res
	return true
}

// ParseOutcome reads a worker's outcome headers: Throttler-Status (absent
// or "done", "retry" with an optional Retry-After in seconds, at most
// MaxPause, "dead",
// "release", or "progress", which only extends the lease) and the optional
// Throttler-Error. An unknown status is an error.
func ParseOutcome(h nats.Header) (res Result, progress bool, err error) {
	status := strings.ToLower(strings.TrimSpace(h.Get(HeaderStatus)))
	reason := h.Get(HeaderError)
	workerErr := func() error {
		if reason == "" {
			return fmt.Errorf("%w: status %q", ErrWorker, status)
		}
		return fmt.Errorf("%w: status %q: %s", ErrWorker, status, reason)
	}
	switch status {
	case "", "done":
		return Result{Verdict: Done}, false, nil
	case "retry":
		res := Result{Verdict: Retry, Err: workerErr()}
		if v := h.Get(HeaderRetryAfter); v != "" {
			f, ok := parseNonNegFloat(v)
			if !ok {
				return Result{}, false, fmt.Errorf("%s: %q is not a number of seconds", HeaderRetryAfter, v)
			}
			// 0 asks for nothing: the lane's backoff applies. Longer
			// than MaxPause is cut to it.
			res.RetryAfter, _ = secondsToPause(f)
		}
		return res, false, nil
	case "dead":
		return Result{Verdict: Dead, Err: workerErr()}, false, nil
	case api.StatusRelease:
		return Result{Verdict: Retry, Unstarted: true, Err: workerErr()}, false, nil
	case api.StatusProgress:
		return Result{}, true, nil
	}
	return Result{}, false, fmt.Errorf("%s: %q is not one of done, retry, dead, release, progress", HeaderStatus, status)
}

// StopPulls stops taking pull requests and answers the parked ones
// "empty" at once, so that their workers ask another instance. Leases
// handed out stay open: their outcomes are still taken until Close.
func (p *Pull) StopPulls() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	_ = p.pullSub.Unsubscribe()
	var answer []string
	for e := p.parked.Front(); e != nil; e = p.parked.Front() {
		pp := e.Value.(*parkedPull)
		p.removeLocked(pp)
		if pp.timer.Stop() {
			answer = append(answer, pp.reply)
		}
	}
	p.mu.Unlock()
	for _, r := range answer {
		p.answer(r, api.StatusEmpty, "")
	}
}

// Close stops taking pull requests and outcomes.
func (p *Pull) Close() {
	p.StopPulls()
	_ = p.ackSub.Unsubscribe()
}
