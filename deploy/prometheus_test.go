package deploy

import (
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// ruleFile is the part of a Prometheus rule file the checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestPrometheusRules checks the rule file with promtool and runs its unit tests.
func TestPrometheusRules(t *testing.T) {
	promtool := tool(t, "promtool", "apt-get install prometheus")
	run(t, "prometheus", promtool, "check", "rules", "idemd-rules.yaml")
	run(t, "prometheus", promtool, "test", "rules", "idemd-rules.test.yaml")
}

// TestEveryAlertIsTested holds the unit tests to every alert: each must be shown
// firing on some series and quiet on another (or before its `for` has run out).
func TestEveryAlertIsTested(t *testing.T) {
	raw, err := os.ReadFile("prometheus/idemd-rules.test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				AlertName string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.AlertName] = true
			} else {
				quiet[a.AlertName] = true
			}
		}
	}
	raw, err = os.ReadFile("prometheus/idemd-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: tested firing %v, tested quiet %v; it needs both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
	if alerts == 0 {
		t.Fatal("the rule file has no alerts")
	}
}
