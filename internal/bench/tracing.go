package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/tracing"
)

// drainTracing: the cost of OpenTelemetry on the drain. Lanes get the
// same prefilled backlog, every job with a sampled traceparent, as
// published on NATS; half drain with tracing off (the context only
// travels), half with the tracer cmd/throttler builds exporting every
// span (the NATS intake, the queue wait and the attempt of each job) over
// OTLP/HTTP to a receiver in this process that reads and drops each export
// (it decodes nothing, so the throttler is charged for the export only).
// A span the tracer dropped (queue full) would make the "on" side cheaper:
// the row fails when any was. Off and on
// alternate, traceRounds times, and each side's best run counts: on a
// shared machine one drain's rate moves by a quarter from run to run. The
// row is the ratio of the two (goal ≥ 0.9×).
//
// sampledEvery says which jobs' traceparents are flagged sampled: every
// one (1), or one in sampledEvery, as when the submitters sample that
// share of their traces (the default sampler follows their decision).
func (e *env) drainTracing(ctx context.Context, sk *sink, n, sampledEvery int) (Result, error) {
	name := "drain, 1 lane → sink: jobs/s, tracing on (vs off), every job sampled"
	if sampledEvery > 1 {
		name = fmt.Sprintf("drain, 1 lane → sink: jobs/s, tracing on (vs off), 1 job in %d sampled", sampledEvery)
	}
	const traceRounds = 3
	lo := laneOpts{rate: bucket.MaxRate, burst: 1, inflight: drainInflight, backlog: int64(2 * n)}
	lanes := map[string]laneOpts{}
	var order []string // off, on, off, on, ...
	for r := range traceRounds {
		off, on := e.lane("traceoff"+strconv.Itoa(r)), e.lane("traceon"+strconv.Itoa(r))
		lanes[off], lanes[on] = lo, lo
		order = append(order, off, on)
	}
	cfg, err := e.serviceConfig(svcOpts{dataDir: e.dir("tracing" + strconv.Itoa(sampledEvery)), target: sk.URL, lanes: lanes})
	if err != nil {
		return Result{}, err
	}
	// Streams first (a service start), then the backlogs with their
	// traceparents.
	svc, err := e.startService(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	svc.stop()
	if err := e.withNATS(ctx, cfg.NATS.DataDir, func(js jetstream.JetStream) error {
		for _, lane := range order {
			if err := publishTraced(ctx, js, queue.Subject(lane, ""), n, sampledEvery); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return Result{}, err
	}

	var exported atomic.Int64     // bytes of OTLP exports received
	var droppedSpans atomic.Int64 // spans the tracer dropped
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.Copy(io.Discard, r.Body)
		exported.Add(b)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()

	// drain returns the lane's rate and the CPU time this process (the
	// service, its NATS server, the sink and the receiver) spent per job
	// from the start of the drain to the last span flushed: on a shared
	// machine the rate moves with the neighbours' load, the CPU per job
	// much less.
	drain := func(lane string, traced bool) (float64, time.Duration, error) {
		c := cfg
		c.Lanes = nil
		for _, l := range cfg.Lanes {
			if l.Name == lane {
				c.Lanes = []config.Lane{l}
			}
		}
		sk.reset(n)
		var tr *tracing.Tracer
		var with func(*service.Service)
		stopExports := func() {}
		if traced {
			reg := prometheus.NewRegistry()
			var err error
			tr, err = tracing.New(tracing.Config{Endpoint: recv.URL + "/v1/traces", Sampler: tracing.DefaultSampler, Registry: reg})
			if err != nil {
				return 0, 0, err
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = tr.Run(rctx)
			}()
			stopExports = func() {
				cancel()
				<-done
				droppedSpans.Add(int64(dropped(reg)))
			}
			with = func(s *service.Service) { s.TraceWith(tr) }
		}
		cpu0, cerr := cpuTime(os.Getpid())
		svc, err := e.startServiceWith(ctx, c, with)
		if err != nil {
			return 0, 0, err
		}
		werr := sk.wait(ctx, n, 2*e.dur+time.Duration(n)*time.Millisecond, e.prog, "drain "+lane)
		if tr != nil {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = tr.Flush(fctx)
			cancel()
		}
		cpu1, err := cpuTime(os.Getpid())
		if cerr == nil {
			cerr = err
		}
		svc.stop()
		stopExports()
		if werr != nil {
			return 0, 0, werr
		}
		var perJob time.Duration
		if cerr == nil {
			perJob = (cpu1 - cpu0) / time.Duration(n)
		}
		arrivals, _ := sk.snapshot()
		return pacingOf(arrivals, 0).Achieved, perJob, nil
	}
	var offRate, onRate float64
	var offCPU, onCPU []time.Duration
	var runs []string
	for i, lane := range order {
		traced := i%2 == 1
		r, cpu, err := drain(lane, traced)
		if err != nil {
			return Result{}, err
		}
		side := "off "
		if traced {
			onRate = max(onRate, r)
			onCPU = append(onCPU, cpu)
			side = "on "
		} else {
			offRate = max(offRate, r)
			offCPU = append(offCPU, cpu)
		}
		runs = append(runs, side+fmtRate(r)+" ("+fmtCPU(cpu)+" CPU/job)")
	}
	sampled := int64(traceRounds * ((n + sampledEvery - 1) / sampledEvery))
	cpuNote := fmt.Sprintf("; %s bytes of OTLP exports, %s per sampled job, no span dropped (BenchmarkTraceSpans in internal/lane says what a job's spans take)",
		fmtInt(exported.Load()), fmtInt(exported.Load()/max(sampled, 1)))
	if off, on := medianDuration(offCPU), medianDuration(onCPU); off > 0 && on > 0 {
		cpuNote += fmt.Sprintf("; CPU per job (median): off %s, on %s, a CPU-bound ratio of %.2f×", fmtCPU(off), fmtCPU(on), float64(off)/float64(on))
	}
	if exported.Load() == 0 {
		return Result{}, errors.New("bench: tracing on, but no span reached the OTLP receiver")
	}
	if d := droppedSpans.Load(); d > 0 {
		return Result{}, fmt.Errorf("bench: the tracer dropped %d spans (its queue was full): the drains did not do equal work", d)
	}
	return Result{
		ID: Drain, Scenario: name,
		Ours:      fmt.Sprintf("%s (%s jobs, 3 spans a sampled one, OTLP/HTTP batches; best of %d)", fmtRate(onRate), fmtInt(int64(n)), traceRounds),
		Reference: fmtRate(offRate),
		Ratio:     fmtRatio(onRate, offRate),
		Goal:      "≥ 0.90×",
		Verdict:   verdict(onRate >= 0.9*offRate),
		Note: "the reference is the same drain with tracing off (the traceparent still travels to the sink); " +
			"on, the NATS intake, queue-wait and attempt spans of each job go through the tracer's batches to an OTLP/HTTP receiver in this process " +
			"that reads and drops each export; runs in order: " + strings.Join(runs, ", ") + cpuNote,
	}, nil
}

// fmtCPU prints a CPU time per job in µs.
func fmtCPU(d time.Duration) string {
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

// medianDuration is the median of ds (the lower middle of an even count);
// 0 for none or when any is 0 (a CPU time that could not be read).
func medianDuration(ds []time.Duration) time.Duration {
	if len(ds) == 0 || slices.Contains(ds, 0) {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// publishTraced stores n jobs on subject, each with a traceparent of its
// own trace, one in sampledEvery flagged sampled.
func publishTraced(ctx context.Context, js jetstream.JetStream, subject string, n, sampledEvery int) error {
	_, err := publishWindowed(ctx, js, subject, n, drainPayload, false, false, nil, func(i int, m *nats.Msg) {
		flags := 0
		if i%max(sampledEvery, 1) == 0 {
			flags = 1
		}
		m.Header["traceparent"] = []string{fmt.Sprintf("00-%032x-%016x-%02x", i+1, uint64(i+1)<<8|1, flags)}
	})
	return err
}

// dropped is the tracer's count of spans it dropped, of every reason.
func dropped(g prometheus.Gatherer) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "throttler_trace_spans_dropped_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
