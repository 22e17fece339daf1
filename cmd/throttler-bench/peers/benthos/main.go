// Command benthos-peer is the Benthos pipeline throttler-bench compares the
// throttler with: an http_server input, a local rate_limit resource and an
// http_client output, built with Benthos's Go API
// (github.com/redpanda-data/benthos/v4). It is a module of its own so that
// neither the service nor the load tool links Benthos.
//
//	go run . --listen 127.0.0.1:4195 --target http://127.0.0.1:9000/hook --rate 100
//
// Each POST to http://<listen>/post is delivered to target at most once
// per 1/rate, in arrival order, with at most --inflight deliveries at once;
// the request is answered when its delivery was (the input's default
// synchronous acknowledgement), so a request waits in Benthos's memory
// until its turn.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benthos-peer:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:4195", "address of the http_server input")
	target := flag.String("target", "", "URL the http_client output POSTs to")
	rate := flag.Float64("rate", 100, "deliveries per second (a local rate_limit of one per 1/rate)")
	inflight := flag.Int("inflight", 64, "max_in_flight of the output")
	flag.Parse()
	if *target == "" || *rate <= 0 {
		return fmt.Errorf("--target and a positive --rate are required")
	}
	period := time.Duration(float64(time.Second) / *rate)
	yaml := fmt.Sprintf(`
http:
  enabled: false
input:
  http_server:
    address: %q
    path: /post
    timeout: 600s
rate_limit_resources:
  - label: lane
    local:
      count: 1
      interval: %q
output:
  http_client:
    url: %q
    verb: POST
    rate_limit: lane
    max_in_flight: %d
    timeout: 10s
logger:
  level: warn
`, *listen, period.String(), *target, *inflight)
	b := service.NewStreamBuilder()
	if err := b.SetYAML(yaml); err != nil {
		return err
	}
	stream, err := b.Build()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Println("ready")
	if err := stream.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
