package deploy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// selector is a metric named in a PromQL expression, with the labels its matchers use.
type selector struct {
	metric string
	labels []string
}

// grouping keywords take a parenthesised list of label names.
var grouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// keywords are the other identifiers that name no metric: operators, and the
// aggregations, which may have their grouping before their parentheses.
var keywords = map[string]bool{"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
	"inf": true, "nan": true, "sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// selectors finds the metric selectors of a PromQL expression. It is a scanner, not a
// parser: it skips strings, ranges, numbers, functions, aggregations and their
// grouping lists, and reads every other identifier as a metric name, with the label
// names of its {matchers}.
func selectors(expr string) ([]selector, error) {
	var out []selector
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\n' || expr[i] == '\t') {
			i++
		}
		return i
	}
	skipString := func(i int) (int, error) {
		quote := expr[i]
		for j := i + 1; j < len(expr); j++ {
			if expr[j] == '\\' && quote != '`' {
				j++
			} else if expr[j] == quote {
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d", i)
	}
	skipTo := func(i int, end byte) (int, error) {
		for j := i; j < len(expr); j++ {
			if expr[j] == end {
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("no %q after %d", end, i)
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := skipTo(i, ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name at %d", i)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			name := expr[i:j]
			next := skipSpace(j)
			switch {
			case grouping[name]:
				if next < len(expr) && expr[next] == '(' {
					k, err := skipTo(next, ')')
					if err != nil {
						return nil, err
					}
					next = k
				}
				i = next
				continue
			case keywords[strings.ToLower(name)], next < len(expr) && expr[next] == '(':
				i = j
				continue
			}
			sel := selector{metric: name}
			i = j
			if next < len(expr) && expr[next] == '{' {
				k := next + 1
				for {
					k = skipSpace(k)
					if k >= len(expr) {
						return nil, fmt.Errorf("unterminated matchers of %s", name)
					}
					if expr[k] == '}' {
						k++
						break
					}
					if expr[k] == ',' {
						k++
						continue
					}
					l := k
					for l < len(expr) && isIdent(expr[l]) {
						l++
					}
					if l == k {
						return nil, fmt.Errorf("bad matcher of %s at %d", name, k)
					}
					sel.labels = append(sel.labels, expr[k:l])
					l = skipSpace(l)
					for l < len(expr) && strings.IndexByte("=!~", expr[l]) >= 0 {
						l++
					}
					l = skipSpace(l)
					if l >= len(expr) || expr[l] != '"' && expr[l] != '\'' && expr[l] != '`' {
						return nil, fmt.Errorf("matcher of %s without a value at %d", name, l)
					}
					end, err := skipString(l)
					if err != nil {
						return nil, err
					}
					k = end
				}
				i = k
			}
			out = append(out, sel)
		default:
			i++
		}
	}
	return out, nil
}

func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (job, tenant) (rate(idemd_requests_total{endpoint=~"[A-Z]+ /v1/.*", outcome="a,b}"}[5m]))`, []string{"idemd_requests_total:endpoint,outcome"}},
		{`a:b:rate5m > 0.5 unless on (job) c_total > 1e3`, []string{"a:b:rate5m", "c_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket{job=~"$job"}[$__rate_interval])))`, []string{"x_bucket:job"}},
		{`predict_linear(size_bytes[6h], 24 * 3600) > 10 * 1024`, []string{"size_bytes"}},
		{`count by (version) (info{job="j"}) or vector(0)`, []string{"info:job"}},
	} {
		sels, err := selectors(tc.expr)
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		var got []string
		for _, s := range sels {
			got = append(got, strings.TrimSuffix(s.metric+":"+strings.Join(s.labels, ","), ":"))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("selectors(%s) = %v, want %v", tc.expr, got, tc.want)
		}
	}
}

// expression is a PromQL expression and where it comes from.
type expression struct{ where, expr string }

func ruleExpressions(t *testing.T) (exprs []expression, recorded map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile("prometheus/idemd-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	recorded = map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
			exprs = append(exprs, expression{"rule " + r.Record + r.Alert, r.Expr})
		}
	}
	return exprs, recorded
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Definition string          `json:"definition"`
			Datasource json.RawMessage `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Panels     []panel         `json:"panels"`
	Targets    []struct {
		Expr       string          `json:"expr"`
		Datasource json.RawMessage `json:"datasource"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile("grafana/idemd-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}
	return d
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_]\w*\)$`)

// dashboardExpressions returns the dashboard's queries and its variables' queries, and
// checks its shape: a uid, unique panel ids, a query on every panel, the data source
// variable everywhere, and only defined variables in the queries.
func dashboardExpressions(t *testing.T, d dashboard) []expression {
	t.Helper()
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title to be provisioned")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	var exprs []expression
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "query" {
			m := labelValues.FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
				continue
			}
			exprs = append(exprs, expression{"variable " + v.Name, m[1]})
		}
	}
	ids := map[int]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if !strings.Contains(string(p.Datasource), "${datasource}") {
				t.Errorf("panel %q does not use the datasource variable: %s", p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, expression{"panel " + p.Title, tg.Expr})
			}
		}
	}
	walk(d.Panels)
	used := regexp.MustCompile(`\$\{?(\w+)`)
	for _, e := range exprs {
		for _, m := range used.FindAllStringSubmatch(e.expr, -1) {
			if !vars[m[1]] {
				t.Errorf("%s uses the undefined variable $%s", e.where, m[1])
			}
		}
	}
	return exprs
}

// TestMetricsExist starts real daemons and checks that every metric the rules and the
// dashboard query is one idemd exports (or one the rules record, or Prometheus's up),
// with the labels their matchers name.
func TestMetricsExist(t *testing.T) {
	exported := exported(t)
	ruleExprs, recorded := ruleExpressions(t)
	exprs := append(ruleExprs, dashboardExpressions(t, loadDashboard(t))...)
	// Prometheus adds job and instance to every scraped series, and makes up itself.
	const scrapeLabels = "job instance"
	for _, e := range exprs {
		sels, err := selectors(e.expr)
		if err != nil {
			t.Errorf("%s: %v", e.where, err)
			continue
		}
		if len(sels) == 0 {
			t.Errorf("%s queries no metric: %s", e.where, e.expr)
		}
		for _, s := range sels {
			switch {
			case recorded[s.metric]:
				continue
			case s.metric == "up":
				continue
			case exported[s.metric] == nil:
				t.Errorf("%s queries %s, which idemd does not export", e.where, s.metric)
				continue
			}
			for _, l := range s.labels {
				if !exported[s.metric][l] && !strings.Contains(scrapeLabels, l) {
					t.Errorf("%s matches %s on label %s, which it does not have", e.where, s.metric, l)
				}
			}
		}
	}
}
