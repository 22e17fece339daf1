// Package worker serves a throttler lane from a Go program: a fixed pool of
// workers that each ask for their next job when they are free (the lane's
// target is {nats: {subject: S, mode: pull}}), run it, and report the
// outcome, by the wire protocol of docs/WORKERS.md.
//
// A Pool of Concurrency workers never holds more jobs than it runs: each
// worker asks for one job at a time, so a slow job never keeps another one
// waiting behind it while a worker elsewhere idles. The throttler paces the
// jobs and bounds them by the lane's max_inflight across all pools.
//
// The handler's error is the outcome: nil is done; Dead(err) dead-letters
// the job; RetryAfter(d, err) asks for a retry after d; any other error
// retries it after the lane's backoff. While the handler runs, the pool
// extends the job's lease. When Run's context ends, the pool stops asking
// for jobs, hands back at once a job that reaches it from then on (nothing
// is counted against it), and waits for the running handlers up to
// Config.StopTimeout; a handler still running then has its context
// cancelled, and a job it gives up that way is handed back too.
//
//	pool, err := worker.New(nc, worker.Config{Subject: "jobs.work"},
//		worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
//			return process(ctx, job.Payload)
//		}))
//	if err != nil { … }
//	err = pool.Run(ctx) // until ctx ends
//
// A worker that logs in as a worker user (nats.workers, docs/WORKERS.md)
// connects with that user's inbox prefix, InboxPrefix(user): the throttler
// answers a pull request only inside the inbox of a worker of the lane.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
)

// Header names and status values of the wire protocol (docs/WORKERS.md),
// documented one by one in package api.
const (
	HeaderIdempotencyKey = api.HeaderIdempotencyKey
	HeaderThrottleKey    = api.HeaderThrottleKey
	HeaderLane           = api.HeaderLane
	HeaderAttempt        = api.HeaderAttempt
	HeaderStatus         = api.HeaderStatus
	HeaderError          = api.HeaderError
	HeaderRetryAfter     = api.HeaderRetryAfter
	HeaderExpires        = api.HeaderExpires
	HeaderWorker         = api.HeaderWorker
	HeaderAck            = api.HeaderAck
	HeaderLease          = api.HeaderLease

	StatusDone     = api.StatusDone
	StatusRetry    = api.StatusRetry
	StatusDead     = api.StatusDead
	StatusRelease  = api.StatusRelease
	StatusProgress = api.StatusProgress
	StatusEmpty    = api.StatusEmpty
	StatusAccepted = api.StatusAccepted
	StatusRefused  = api.StatusRefused
)

// Config configures a Pool. Subject is required; the zero value of every
// other field is a sensible default.
type Config struct {
	// Subject is the lane's work subject (target.nats.subject).
	Subject string
	// Concurrency is how many jobs the pool runs at once, each worker
	// asking for its own; 0 means 1.
	Concurrency int
	// Name identifies the pool in the throttler's logs; it need not be
	// unique.
	Name string
	// PullWait is how long one pull request waits for a job before the
	// throttler answers "empty" and the worker asks again; 0 means 5 s.
	// It also bounds how long a worker waits on an instance that died
	// with its request (one that stops answers at once).
	PullWait time.Duration
	// StopTimeout bounds how long Run waits, once its context ended, for
	// running handlers before cancelling their contexts; 0 means 30 s.
	StopTimeout time.Duration
	// ReportTimeout bounds one report to the throttler; 0 means 5 s.
	ReportTimeout time.Duration
	// Logger receives refused reports and lost leases; nil discards.
	Logger *slog.Logger
}

// Validate returns an error naming the first bad field, or nil.
func (c Config) Validate() error {
	switch {
	case c.Subject == "" || strings.ContainsAny(c.Subject, "*> \t\r\n") || strings.Contains(c.Subject, ".."):
		return fmt.Errorf("worker: Config.Subject: %q is not a literal NATS subject", c.Subject)
	case c.Concurrency < 0:
		return fmt.Errorf("worker: Config.Concurrency: %d is negative", c.Concurrency)
	case c.PullWait < 0 || (c.PullWait > 0 && c.PullWait < api.MinPullExpires) || c.PullWait > api.MaxPullExpires:
		return fmt.Errorf("worker: Config.PullWait: %v is not between %v and %v", c.PullWait, api.MinPullExpires, api.MaxPullExpires)
	case c.StopTimeout < 0:
		return fmt.Errorf("worker: Config.StopTimeout: %v is negative", c.StopTimeout)
	case c.ReportTimeout < 0:
		return fmt.Errorf("worker: Config.ReportTimeout: %v is negative", c.ReportTimeout)
	}
	return nil
}

// Job is one job handed to a worker.
type Job struct {
	// ID is the job's id (Idempotency-Key): the same on every attempt,
	// so that a handler can make its effect idempotent.
	ID string
	// Lane is the lane's name; Key the job's key on a keyed lane.
	Lane, Key   string
	ContentType string
	Payload     []byte
	// Attempt counts deliveries, 1 for the first.
	Attempt int
	// Lease is how long the job is held for without a report; the pool
	// extends it while the handler runs.
	Lease time.Duration
	// Header holds every header as received.
	Header nats.Header
}

// Handler runs one job. Its error is the outcome (see the package doc).
type Handler interface {
	Work(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

// Work implements Handler.
func (f HandlerFunc) Work(ctx context.Context, job *Job) error { return f(ctx, job) }

// outcome is a handler's verdict beyond done and a plain retry.
type outcome struct {
	status string
	after  time.Duration
	err    error
}

func (o *outcome) Error() string {
	if o.err == nil {
		return "worker: " + o.status
	}
	return o.err.Error()
}

func (o *outcome) Unwrap() error { return o.err }

// Dead marks err as final: the job goes to the lane's dead letters and is
// not retried.
func Dead(err error) error { return &outcome{status: StatusDead, err: err} }

// RetryAfter asks for the job to be tried again after d (at the earliest),
// instead of after the lane's backoff. It counts an attempt.
func RetryAfter(d time.Duration, err error) error {
	return &outcome{status: StatusRetry, after: d, err: err}
}

// Release hands the job back unstarted: it goes back to the queue at once
// and no attempt is counted (the worker cannot take it now).
func Release(err error) error { return &outcome{status: StatusRelease, err: err} }

// Pool is a fixed pool of workers of one lane. Create it with New and Run
// it once.
type Pool struct {
	nc      *nats.Conn
	cfg     Config
	handler Handler
	log     *slog.Logger
}

// New checks cfg and returns a Pool on nc. It starts nothing; the pool
// does not own nc.
func New(nc *nats.Conn, cfg Config, h Handler) (*Pool, error) {
	if nc == nil {
		return nil, errors.New("worker: nil connection")
	}
	if h == nil {
		return nil, errors.New("worker: nil handler")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.PullWait == 0 {
		cfg.PullWait = 5 * time.Second
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	if cfg.ReportTimeout == 0 {
		cfg.ReportTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pool{nc: nc, cfg: cfg, handler: h, log: log.With("component", "worker", "subject", cfg.Subject)}
	if user := nc.Opts.User; user != "" && nc.Opts.InboxPrefix != inboxRoot+"."+user {
		// The throttler answers only inside a worker user's own inbox:
		// every pull request of this pool would go unanswered.
		p.log.Warn("the connection's inbox prefix is not its user's: the throttler will not answer it",
			"user", user, "inbox_prefix", nc.Opts.InboxPrefix, "fix", "connect with worker.InboxPrefix(user)")
	}
	return p, nil
}

// inboxRoot is the first token of a worker user's inbox prefix.
const inboxRoot = "_INBOX"

// InboxPrefix is the connection option of a worker user's connection:
// its inboxes are then _INBOX.<user>.…, the only subjects the throttler
// answers a worker on (for the lanes the worker user is listed for in
// nats.workers) and the only ones the worker may read under the
// permissions of docs/WORKERS.md. It is nats.CustomInboxPrefix("_INBOX." +
// user); the nats CLI spells it --inbox-prefix _INBOX.<user>.
//
//	nc, err := nats.Connect(url, nats.UserInfo("render-1", pw), worker.InboxPrefix("render-1"))
func InboxPrefix(user string) nats.Option { return nats.CustomInboxPrefix(inboxRoot + "." + user) }

// Run serves jobs until ctx ends, then stops gracefully (see the package
// doc) and returns nil; it returns early only with an error that stops
// every worker (the connection closed).
func (p *Pool) Run(ctx context.Context) error {
	// Handlers outlive ctx by up to StopTimeout.
	work, cutWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cutWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(p.cfg.StopTimeout, cutWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()
	errs := make(chan error, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for range p.cfg.Concurrency {
		wg.Go(func() { errs <- p.serve(ctx, work) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// serve is one worker: ask, run, report, until ctx ends.
func (p *Pool) serve(ctx, work context.Context) error {
	inbox := p.nc.NewInbox()
	jobs := make(chan *nats.Msg, 4)
	sub, err := p.nc.ChanSubscribe(inbox, jobs)
	if err != nil {
		return fmt.Errorf("worker: subscribe: %w", err)
	}
	defer p.handBack(sub, jobs)
	pull := nats.NewMsg(p.cfg.Subject)
	pull.Reply = inbox
	pull.Header.Set(HeaderExpires, strconv.FormatInt(p.cfg.PullWait.Milliseconds(), 10))
	if p.cfg.Name != "" {
		pull.Header.Set(HeaderWorker, p.cfg.Name)
	}
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		if backoff > 0 {
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
		}
		if err := p.nc.PublishMsg(pull); err != nil {
			if errors.Is(err, nats.ErrConnectionClosed) {
				return fmt.Errorf("worker: %w", err)
			}
			backoff = nextBackoff(backoff)
			continue
		}
		// The throttler answers within PullWait; a little more covers the
		// trip.
		timeout := time.NewTimer(p.cfg.PullWait + 2*time.Second)
		var m *nats.Msg
		select {
		case m = <-jobs:
		case <-timeout.C:
		case <-ctx.Done():
		}
		timeout.Stop()
		if m == nil {
			continue // stopping (handBack takes what comes), or no answer: ask again
		}
		switch status := m.Header.Get(HeaderStatus); {
		case m.Header.Get("Status") == "503":
			// No instance listens on the subject (yet).
			backoff = nextBackoff(backoff)
		case status == StatusEmpty:
			backoff = 0
		case status == StatusRefused:
			p.log.Warn("pull request refused", "reason", m.Header.Get(HeaderError))
			backoff = nextBackoff(backoff)
		case m.Reply == "":
			p.log.Warn("answer without an outcome subject ignored", "status", status)
			backoff = nextBackoff(backoff)
		case ctx.Err() != nil:
			p.report(m.Reply, StatusRelease, 0, errors.New("worker stopping"))
		default:
			backoff = 0
			p.run(work, m)
		}
	}
	return nil
}

// nextBackoff doubles a wait between 100 ms and 5 s.
func nextBackoff(d time.Duration) time.Duration {
	return min(max(2*d, 100*time.Millisecond), 5*time.Second)
}

// handBack stops the worker's inbox and hands back every job that reached
// it: the server forgets the inbox only after the messages it sent before,
// which Drain still delivers; a job sent after that gets the server's
// no-responders answer, which the throttler takes as handed back.
func (p *Pool) handBack(sub *nats.Subscription, jobs chan *nats.Msg) {
	if err := sub.Drain(); err == nil {
		closed := sub.StatusChanged(nats.SubscriptionClosed)
		if sub.IsValid() {
			select {
			case <-closed:
			case <-time.After(p.cfg.ReportTimeout):
			}
		}
	} else {
		_ = sub.Unsubscribe()
	}
	for {
		select {
		case m := <-jobs:
			if m.Reply != "" && m.Header.Get(HeaderIdempotencyKey) != "" {
				p.report(m.Reply, StatusRelease, 0, errors.New("worker stopping"))
			}
		default:
			return
		}
	}
}

// run runs one job's handler, extends its lease meanwhile, and reports.
func (p *Pool) run(work context.Context, m *nats.Msg) {
	job := jobOf(m)
	hctx, cancel := context.WithCancelCause(work)
	defer cancel(nil)
	stopExtend := p.extend(hctx, cancel, m.Reply, job)
	err := p.call(hctx, job)
	stopExtend()
	status, after := StatusDone, time.Duration(0)
	var o *outcome
	switch {
	case err == nil:
	case errors.As(err, &o):
		status, after = o.status, o.after
	case work.Err() != nil:
		// Cut short by the stop: not the job's fault.
		status = StatusRelease
	case context.Cause(hctx) == errLeaseLost:
		return // the job is someone else's now; a report would be refused
	default:
		status = StatusRetry
	}
	p.report(m.Reply, status, after, err)
}

// errLeaseLost cancels a handler whose lease the throttler no longer
// knows (expired, or the instance restarted).
var errLeaseLost = errors.New("worker: the job's lease was lost")

// call runs the handler, turning a panic into a retry.
func (p *Pool) call(ctx context.Context, job *Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker: handler panicked: %v", r)
		}
	}()
	return p.handler.Work(ctx, job)
}

// extend reports progress every third of the lease until stopped; a
// refused report cancels the handler (the lease is gone).
func (p *Pool) extend(ctx context.Context, cancel context.CancelCauseFunc, ack string, job *Job) (stop func()) {
	every := job.Lease / 3
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if p.report(ack, StatusProgress, 0, nil) == errRefused {
					cancel(errLeaseLost)
					return
				}
			case <-done:
				return
			case <-ctx.Done():
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// errRefused: the throttler refused a report.
var errRefused = errors.New("worker: report refused")

// report sends a status for the job whose outcome subject is ack and
// waits for the throttler's answer.
func (p *Pool) report(ack, status string, after time.Duration, cause error) error {
	msg := nats.NewMsg(ack)
	msg.Header.Set(HeaderStatus, status)
	if cause != nil && status != StatusDone {
		msg.Header.Set(HeaderError, headerText(cause.Error()))
	}
	if status == StatusRetry && after > 0 {
		msg.Header.Set(HeaderRetryAfter, strconv.FormatInt(int64(math.Ceil(after.Seconds())), 10))
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ReportTimeout)
	defer cancel()
	reply, err := p.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		// The instance that handed the job out is gone or slow: the job
		// comes back by the lease or the queue's own timeout.
		p.log.Warn("report not answered", "status", status, "err", err)
		return err
	}
	if reply.Header.Get(HeaderStatus) == StatusRefused {
		p.log.Warn("report refused", "status", status, "reason", reply.Header.Get(HeaderError))
		return errRefused
	}
	return nil
}

// headerText makes s a header value: one line, at most 512 bytes.
func headerText(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// jobOf reads a handed-out job.
func jobOf(m *nats.Msg) *Job {
	j := &Job{
		ID: m.Header.Get(HeaderIdempotencyKey), Lane: m.Header.Get(HeaderLane), Key: m.Header.Get(HeaderThrottleKey),
		ContentType: m.Header.Get("Content-Type"), Payload: m.Data, Header: m.Header,
	}
	j.Attempt, _ = strconv.Atoi(m.Header.Get(HeaderAttempt))
	if ms, err := strconv.ParseInt(m.Header.Get(HeaderLease), 10, 64); err == nil && ms > 0 {
		j.Lease = time.Duration(ms) * time.Millisecond
	}
	return j
}
