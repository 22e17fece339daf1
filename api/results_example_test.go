package api_test

import (
	"fmt"

	"github.com/throttler/throttler/api"
)

// A NATS publisher subscribes to its job's results subject before it
// publishes the job; an id that is not one subject token is encoded.
func ExampleResultsSubject() {
	fmt.Println(api.ResultsSubject("demo", "order-42"))
	fmt.Println(api.ResultsSubject("demo", "order.7"))
	// Output:
	// throttler.results.demo.order-42
	// throttler.results.demo.~b3JkZXIuNw
}
