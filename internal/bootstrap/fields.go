package bootstrap

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// unknownField returns the JSON path of the first field in data that
// Document does not have, or "". encoding/json reports only the bare name
// of an unknown field; the author needs to know where it is.
func unknownField(data []byte) string {
	var generic any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return ""
	}
	return walkUnknown(generic, reflect.TypeOf(Document{}), "")
}

func walkUnknown(v any, t reflect.Type, path string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch val := v.(type) {
	case map[string]any:
		if t.Kind() == reflect.Map {
			return walkMap(val, t.Elem(), path)
		}
		if t.Kind() != reflect.Struct {
			return ""
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			fields[name] = t.Field(i).Type
		}
		keys := make([]string, 0, len(val))
		for k := range val {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return join(path, k)
			}
			if p := walkUnknown(val[k], ft, join(path, k)); p != "" {
				return p
			}
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return ""
		}
		for i, e := range val {
			if p := walkUnknown(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
	}
	return ""
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// walkMap looks inside the values of a map field such as extraArgs, whose
// keys are data rather than field names.
func walkMap(m map[string]any, elem reflect.Type, path string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if p := walkUnknown(m[k], elem, join(path, k)); p != "" {
			return p
		}
	}
	return ""
}
