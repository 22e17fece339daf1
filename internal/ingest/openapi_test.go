package ingest

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/clock"
	"go.yaml.in/yaml/v3"
)

// openAPIPath is the API description the tests hold to the router.
const openAPIPath = "../../docs/openapi.yaml"

// oasSchema is the OpenAPI Initiative's JSON Schema of OpenAPI 3.1
// documents (https://spec.openapis.org/oas/3.1/schema/2022-10-07, Apache
// License 2.0), kept in testdata so the check needs no network.
const oasSchema = "testdata/oas-3.1-schema.json"

// loadOpenAPI parses docs/openapi.yaml and checks it twice: against the
// OpenAPI 3.1 JSON Schema (santhosh-tekuri/jsonschema), and with
// kin-openapi's own validation (every $ref resolved, every schema
// compilable as JSON Schema 2020-12, examples valid).
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	raw, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	var tree any
	if err := yaml.Unmarshal(raw, &tree); err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	meta, err := jsonschema.NewCompiler().Compile(oasSchema)
	if err != nil {
		t.Fatalf("%s: %v", oasSchema, err)
	}
	if err := meta.Validate(tree); err != nil {
		t.Fatalf("%s is not an OpenAPI 3.1 document: %v", openAPIPath, err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("%s: openapi %s, want 3.1.x", openAPIPath, doc.OpenAPI)
	}
	if err := doc.Validate(context.Background(), openapi3.EnableSchemaFormatValidation(), openapi3.EnableExamplesValidation()); err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	return doc
}

// documentedRoutes lists "METHOD /path" of every operation in the document.
func documentedRoutes(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(out)
	return out
}

var (
	// "{name...}" (rest of the path) reads as "{name}" in OpenAPI.
	restWildcard = regexp.MustCompile(`\{([A-Za-z0-9_]+)\.\.\.\}`)
)

// openAPIRoute turns a ServeMux pattern into the "METHOD /path" it must be
// documented as: "{x...}" becomes "{x}", "{$}" goes, a subtree "/ui/"
// becomes "/ui/{path}", and a pattern without a method is documented as a
// GET. The catch-all "/" (the not-found answer) needs no entry: ok is
// false.
func openAPIRoute(pattern string) (route string, ok bool) {
	method, path, found := strings.Cut(pattern, " ")
	if !found {
		method, path = "GET", pattern
	}
	if i := strings.Index(path, "/"); i > 0 {
		path = path[i:] // a host in the pattern
	}
	if path == "/" {
		return "", false
	}
	if strings.HasSuffix(path, "/") {
		path += "{path}" // a subtree
	}
	path = strings.TrimSuffix(path, "{$}") // exactly the path with its slash
	path = restWildcard.ReplaceAllString(path, "{$1}")
	return method + " " + path, true
}

func TestOpenAPIRoute(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"GET /v1/lanes", "GET /v1/lanes", true},
		{"POST /v1/lanes/{lane}/jobs:batch", "POST /v1/lanes/{lane}/jobs:batch", true},
		{"GET /ui/{file...}", "GET /ui/{file}", true},
		{"GET /ui/", "GET /ui/{path}", true},
		{"GET /ui/{$}", "GET /ui/", true},
		{"/metrics", "GET /metrics", true},
		{"/", "", false},
	} {
		got, ok := openAPIRoute(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("openAPIRoute(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestOpenAPIMatchesRouter: every route the handler registers (with every
// optional part of the API turned on) is in docs/openapi.yaml, and the
// document lists no route the handler does not serve. The route list comes
// from the handler's own router, so a route added in code without its doc
// entry (or the reverse) fails here.
func TestOpenAPIMatchesRouter(t *testing.T) {
	doc := loadOpenAPI(t)
	// Every optional part of the API on.
	f := callerFixture(t, clock.NewManual(time.Unix(0, 0)), func(c *Config) { c.Keys = noKeys{}; c.History = noHistory{} })
	var served []string
	for _, p := range f.h.routes() {
		if r, ok := openAPIRoute(p); ok {
			served = append(served, r)
			if sub, ok := strings.CutSuffix(r, "/{path}"); ok {
				// A subtree serves its own path too (GET /ui/, the
				// page), which a router keeping the slash must find.
				served = append(served, sub+"/")
			}
		}
	}
	slices.Sort(served)
	served = slices.Compact(served)
	if len(served) < 10 {
		t.Fatalf("the router lists only %d routes (%v); the check would prove little", len(served), served)
	}
	documented := documentedRoutes(doc)
	for _, r := range served {
		if !slices.Contains(documented, r) {
			t.Errorf("%s is served but not in docs/openapi.yaml", r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(served, r) {
			t.Errorf("%s is in docs/openapi.yaml but not served", r)
		}
	}
}

// TestOpenAPIDocumentsEveryProblemType: every Problem* constant of this
// package (read from its source) is in the Problem schema's type enum, and
// the enum has nothing else.
func TestOpenAPIDocumentsEveryProblemType(t *testing.T) {
	doc := loadOpenAPI(t)
	problem, ok := doc.Components.Schemas["Problem"]
	if !ok {
		t.Fatal("no Problem schema")
	}
	typ, ok := problem.Value.Properties["type"]
	if !ok {
		t.Fatal("Problem has no type property")
	}
	var documented []string
	for _, n := range typ.Value.Enum {
		s, ok := n.(string)
		if !ok {
			t.Fatalf("Problem type enum holds %v (%T), not a string", n, n)
		}
		documented = append(documented, s)
	}
	code := problemTypes(t)
	if len(code) < 10 {
		t.Fatalf("found only %d problem types in the source: %v", len(code), code)
	}
	for _, c := range code {
		if !slices.Contains(documented, c) {
			t.Errorf("problem type %s is not in the Problem schema of docs/openapi.yaml", c)
		}
	}
	for _, d := range documented {
		if !slices.Contains(code, d) {
			t.Errorf("docs/openapi.yaml lists problem type %s, which the code never answers", d)
		}
	}
}

// problemTypes reads the string constants named Problem* of this package.
func problemTypes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Problem") || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						out = append(out, v)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestOpenAPISchemasMatchWireTypes: each schema's properties are the JSON
// names of its wire type in package api, no more and no fewer, and the
// required ones are those without omitempty.
func TestOpenAPISchemasMatchWireTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, typ := range map[string]any{
		"Accepted": api.Accepted{}, "Lanes": api.Lanes{}, "LaneStatus": api.LaneStatus{}, "Quota": api.Quota{},
		"DeadLetter": api.DeadLetter{}, "DeadLetters": api.DeadLetters{}, "Problem": api.Problem{}, "Whoami": api.Whoami{},
		"BatchItem": api.BatchItem{}, "Trace": api.Trace{}, "LaneHistory": api.LaneHistory{}, "LaneSample": api.LaneSample{}, "BatchResult": api.BatchResult{}, "BatchAccepted": api.BatchAccepted{},
		"KeyStatus": api.KeyStatus{}, "KeyedStatus": api.KeyedStatus{}, "PlanStatus": api.PlanStatus{},
		"Plans": api.Plans{}, "PerIP": api.PerIP{}, "KeyBacklog": api.KeyBacklog{},
	} {
		ref, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("docs/openapi.yaml has no schema %s", name)
			continue
		}
		schema := ref.Value
		var documented []string
		for k := range schema.Properties {
			documented = append(documented, k)
		}
		var fields, required []string
		rt := reflect.TypeOf(typ)
		for i := range rt.NumField() {
			tag := rt.Field(i).Tag.Get("json")
			n, opts, _ := strings.Cut(tag, ",")
			if n == "-" || n == "" {
				continue
			}
			fields = append(fields, n)
			if !strings.Contains(opts, "omitempty") {
				required = append(required, n)
			}
		}
		slices.Sort(documented)
		slices.Sort(fields)
		if !slices.Equal(documented, fields) {
			t.Errorf("schema %s has properties %v; api.%s has %v", name, documented, rt.Name(), fields)
		}
		req := slices.Clone(schema.Required)
		slices.Sort(req)
		slices.Sort(required)
		if !slices.Equal(req, required) {
			t.Errorf("schema %s requires %v; api.%s always writes %v", name, req, rt.Name(), required)
		}
	}
}

// noKeys is a KeyDirectory that knows no key: it turns the keys routes on.
type noKeys struct{}

func (noKeys) KeyStatus(context.Context, string, string) (api.KeyStatus, error) {
	return api.KeyStatus{}, ErrNotKeyed
}

func (noKeys) SetKey(context.Context, string, string, KeyChange, string) (api.KeyStatus, error) {
	return api.KeyStatus{}, ErrNotKeyed
}

// TestOpenAPINumberAndTimeFormats: every number of docs/openapi.yaml says
// format double (without it generated clients read rates as float32), and
// every time field (…_at, …_until) says format date-time. The schemas are
// one flow mapping per line, so the check reads lines.
func TestOpenAPINumberAndTimeFormats(t *testing.T) {
	raw, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	timeField := regexp.MustCompile(`^\s+[a-z_]+_(at|until):`)
	n := 0
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, "type: number") {
			n++
			if !strings.Contains(line, "format: double") {
				t.Errorf("%s:%d: a number without format: double: %s", openAPIPath, i+1, strings.TrimSpace(line))
			}
		}
		if timeField.MatchString(line) && !strings.Contains(line, "format: date-time") {
			t.Errorf("%s:%d: a time without format: date-time: %s", openAPIPath, i+1, strings.TrimSpace(line))
		}
	}
	if n < 5 {
		t.Fatalf("only %d numbers found; the scan is broken", n)
	}
}

// noHistory serves no lane's history.
type noHistory struct{}

func (noHistory) History(string) (api.LaneHistory, bool) { return api.LaneHistory{}, false }
