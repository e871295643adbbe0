package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	yaml "go.yaml.in/yaml/v3"
)

// Error is a problem with a cloud-config document at a line (1-based, of
// the document as the Secret holds it), or of the whole document (Line 0).
type Error struct {
	Line    int
	Problem string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return "cloud-config: " + e.Problem
	}
	return fmt.Sprintf("cloud-config line %d: %s", e.Line, e.Problem)
}

func errAt(line int, format string, args ...any) *Error {
	return &Error{Line: line, Problem: fmt.Sprintf(format, args...)}
}

// The write_files encodings cloud-init reads, by what they decode to.
var (
	base64Encodings = []string{"b64", "base64"}
	gzipEncodings   = []string{"gz+b64", "gzip+b64", "gz+base64", "gzip+base64"}
	plainEncodings  = []string{"", "text/plain"}
)

// placeholder is a jinja expression or statement; Render takes the
// expressions it knows and refuses everything else.
var placeholder = regexp.MustCompile(`\{\{-?\s*(.*?)\s*-?\}\}|\{%.*?%\}|\{#.*?#\}`)

// Render substitutes the instance-data placeholders of a document with a
// jinja header and drops the header, as cloud-init does before it reads the
// YAML, from facts (key: value, keys as in Placeholders). A document
// without the header is returned as it is, as cloud-init would. A
// placeholder facts does not hold, or any other jinja, is an error naming
// its line: this renderer knows only the substitutions QCP's documents use.
func Render(data []byte, facts map[string]string) ([]byte, error) {
	out, _, err := render(data, facts)
	return out, err
}

// render is Render, also returning how many lines it dropped.
func render(data []byte, facts map[string]string) ([]byte, int, error) {
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if strings.TrimSpace(string(first)) != jinjaHeader {
		return data, 0, nil
	}
	lines := strings.Split(string(rest), "\n")
	for i, line := range lines {
		var bad *Error
		lines[i] = placeholder.ReplaceAllStringFunc(line, func(m string) string {
			sub := placeholder.FindStringSubmatch(m)
			v, ok := facts[sub[1]]
			if !strings.HasPrefix(m, "{{") || !ok {
				if bad == nil {
					bad = errAt(i+2, "%s is not a placeholder this provider renders; it supplies only %s", m, strings.Join(sortedKeys(facts), ", "))
				}
				return m
			}
			return v
		})
		if bad != nil {
			return nil, 0, bad
		}
	}
	return []byte(strings.Join(lines, "\n")), 1, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, "{{ "+k+" }}")
	}
	slices.Sort(keys)
	return keys
}

// Parse renders data (Render) and decodes it: a #cloud-config document
// whose modules are write_files and runcmd only, each entry complete. Any
// other module, field or encoding is an error naming its line, since a
// provider that ignored it would boot a machine other than the one asked
// for.
func Parse(data []byte, facts map[string]string) (*Config, error) {
	rendered, offset, err := render(data, facts)
	if err != nil {
		return nil, err
	}
	cfg, err := decode(rendered)
	if e := (*Error)(nil); errors.As(err, &e) && e.Line > 0 {
		e.Line += offset
	}
	return cfg, err
}

// decode reads a rendered document.
func decode(rendered []byte) (*Config, error) {
	if line, _, _ := bytes.Cut(rendered, []byte("\n")); strings.TrimSpace(string(line)) != configLine {
		return nil, errAt(1, "the document starts with %q, not %q (after an optional %q line)", line, configLine, jinjaHeader)
	}
	// yaml.v2 names the line of a syntax error where yaml.v3 names the
	// line before it; v3's nodes give the lines of everything else.
	var syntax any
	if err := yamlv2.Unmarshal(rendered, &syntax); err != nil {
		return nil, yamlError(err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(rendered, &root); err != nil {
		return nil, yamlError(err)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, errAt(root.Line, "the document is not a mapping of cloud-config modules")
	}
	cfg := &Config{}
	top := root.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		key, val := top.Content[i], top.Content[i+1]
		switch key.Value {
		case "write_files":
			if err := decodeFiles(val, cfg); err != nil {
				return nil, err
			}
		case "runcmd":
			if err := decodeCommands(val, cfg); err != nil {
				return nil, err
			}
		default:
			return nil, errAt(key.Line, "module %q is not supported: this provider runs write_files and runcmd only", key.Value)
		}
	}
	return cfg, nil
}

// yamlLine finds the "line N" the YAML parser names.
var yamlLine = regexp.MustCompile(`line (\d+)`)

func yamlError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return errAt(n, "%s", strings.TrimSpace(strings.Replace(msg, m[0]+":", "", 1)))
	}
	return &Error{Problem: msg}
}

func decodeFiles(val *yaml.Node, cfg *Config) error {
	if val.Kind != yaml.SequenceNode {
		return errAt(val.Line, "write_files is not a list of files")
	}
	for _, n := range val.Content {
		var f File
		if err := decodeStrict(n, &f); err != nil {
			return err
		}
		if err := f.check(); err != nil {
			return errAt(n.Line, "write_files entry %q: %v", f.Path, err)
		}
		cfg.WriteFiles = append(cfg.WriteFiles, f)
	}
	return nil
}

func decodeCommands(val *yaml.Node, cfg *Config) error {
	if val.Kind != yaml.SequenceNode {
		return errAt(val.Line, "runcmd is not a list of commands")
	}
	for _, n := range val.Content {
		var argv []string
		switch n.Kind {
		case yaml.ScalarNode:
			argv = strings.Fields(n.Value)
		case yaml.SequenceNode:
			if err := n.Decode(&argv); err != nil {
				return errAt(n.Line, "runcmd entry: %v", err)
			}
		default:
			return errAt(n.Line, "runcmd entry is neither a command line nor a list of arguments")
		}
		if len(argv) == 0 {
			return errAt(n.Line, "runcmd entry is empty")
		}
		cfg.RunCmd = append(cfg.RunCmd, argv)
	}
	return nil
}

// decodeStrict decodes n into out, refusing fields out does not have.
func decodeStrict(n *yaml.Node, out any) error {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(n); err != nil {
		return errAt(n.Line, "%v", err)
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		// Lines in the error are relative to n; report n's own.
		return errAt(n.Line, "%s", strings.TrimSpace(yamlLine.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n"), "")))
	}
	return nil
}

func (f File) check() error {
	var errs []error
	if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
		errs = append(errs, fmt.Errorf("path must be absolute and clean, such as /etc/qcp/bootstrap.yaml"))
	}
	if !slices.Contains(slices.Concat(base64Encodings, gzipEncodings, plainEncodings), f.Encoding) {
		errs = append(errs, fmt.Errorf("encoding %q is not one of cloud-init's (b64, gz+b64, gzip+base64, text/plain)", f.Encoding))
	}
	if _, err := f.Mode(); err != nil {
		errs = append(errs, err)
	}
	if f.Owner != "" && f.Owner != "root" && f.Owner != "root:root" {
		errs = append(errs, fmt.Errorf("owner %q: this provider writes files as root:root only", f.Owner))
	}
	if len(errs) == 0 {
		if _, err := f.Decode(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Mode is the file's permissions (octal, as cloud-init reads them), 0644
// when unset.
func (f File) Mode() (os.FileMode, error) {
	if f.Permissions == "" {
		return 0o644, nil
	}
	m, err := strconv.ParseUint(strings.TrimPrefix(f.Permissions, "0o"), 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("permissions %q are not an octal mode such as '0600'", f.Permissions)
	}
	return os.FileMode(m), nil
}

// Decode returns the file's content, decoded as its encoding says.
func (f File) Decode() ([]byte, error) {
	switch {
	case slices.Contains(plainEncodings, f.Encoding):
		return []byte(f.Content), nil
	case slices.Contains(base64Encodings, f.Encoding):
		b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(f.Content), ""))
		if err != nil {
			return nil, fmt.Errorf("content is not base64: %v", err)
		}
		return b, nil
	case slices.Contains(gzipEncodings, f.Encoding):
		b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(f.Content), ""))
		if err != nil {
			return nil, fmt.Errorf("content is not base64: %v", err)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("content is not gzip: %v", err)
		}
		out, err := io.ReadAll(zr)
		if err != nil {
			return nil, fmt.Errorf("content is not gzip: %v", err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("encoding %q is not one of cloud-init's", f.Encoding)
}
