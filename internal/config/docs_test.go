package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// yamlFields lists the dotted path of every field a config file can set,
// lists written as name[] (lanes[].target.http.url), from the yaml tags of
// t. A type that reads itself (a rate, a duration) or a map is one field.
func yamlFields(t reflect.Type, prefix string, out *[]string) {
	unmarshaler := reflect.TypeFor[yaml.Unmarshaler]()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		path := prefix + name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && !reflect.PointerTo(ft.Elem()).Implements(unmarshaler) {
			yamlFields(ft.Elem(), path+"[].", out)
			continue
		}
		if ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshaler) {
			yamlFields(ft, path+".", out)
			continue
		}
		*out = append(*out, path)
	}
}

// TestConfigDocsNameEveryField: docs/CONFIG.md says what each field of
// the file does. A field is documented when the doc names it in
// backquotes: by its whole path (nats.replicas), by the path inside its
// list item (target.http.url for lanes[].target.http.url, id for
// auth.keys[].id), or on the table row of its parent, in backquotes or
// as a key of a braced form (`nats.pull_login` … `{user, password}`).
func TestConfigDocsNameEveryField(t *testing.T) {
	raw, err := os.ReadFile("../../docs/CONFIG.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	rowOf := func(parent string) string {
		i := strings.Index(doc, "\n| `"+parent+"` |")
		if i < 0 {
			return ""
		}
		row, _, _ := strings.Cut(doc[i+1:], "\n")
		return row
	}
	var fields []string
	yamlFields(reflect.TypeFor[Config](), "", &fields)
	if len(fields) < 100 {
		t.Fatalf("only %d fields found; the walk is broken", len(fields))
	}
	for _, path := range fields {
		inItem := path
		if i := strings.LastIndex(path, "[]."); i >= 0 {
			inItem = path[i+len("[]."):]
		}
		if strings.Contains(doc, "`"+path+"`") || strings.Contains(doc, "`"+inItem+"`") {
			continue
		}
		parent, leaf := inItem[:max(strings.LastIndex(inItem, "."), 0)], inItem[strings.LastIndex(inItem, ".")+1:]
		if row := rowOf(parent); parent != "" && regexp.MustCompile("([{,] *|`)"+regexp.QuoteMeta(leaf)+"(\\b[^.]|`)").MatchString(row) {
			continue
		}
		t.Errorf("docs/CONFIG.md does not name %s", path)
	}
}
