package version

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestOneNumber holds every package of the release to the number Release says, and the
// contract's version to Contract, so that no SDK, chart or changelog drifts from the
// daemon it ships beside.
func TestOneNumber(t *testing.T) {
	root := filepath.Join("..", "..")
	for _, c := range []struct {
		file, pattern, want string
	}{
		{"api/openapi.yaml", `(?m)^info:\n(?:  .*\n)*?  version: (\S+)$`, Contract},
		{"clients/ts/package.json", `(?m)^  "version": "([^"]+)"`, Release},
		{"clients/ts/package-lock.json", `(?m)^  "version": "([^"]+)"`, Release},
		{"clients/python/pyproject.toml", `(?m)^version = "([^"]+)"`, Release},
		{"clients/java/pom.xml", `(?m)^  <version>([^<]+)</version>`, Release},
		{"clients/java/idemd-api/pom.xml", `(?m)^    <version>([^<]+)</version>`, Release},
		{"clients/java/idemd-client/pom.xml", `(?m)^    <version>([^<]+)</version>`, Release},
		{"clients/java/idemd-servlet/pom.xml", `(?m)^    <version>([^<]+)</version>`, Release},
		{"clients/java/idemd-spring-boot-starter/pom.xml", `(?m)^    <version>([^<]+)</version>`, Release},
		{"deploy/helm/idemd/Chart.yaml", `(?m)^appVersion: "([^"]+)"`, Release},
		{"CHANGELOG.md", `(?m)^## ([0-9][^ ]*) `, Release},
	} {
		data, err := os.ReadFile(filepath.Join(root, c.file))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(c.pattern).FindSubmatch(data)
		if m == nil {
			t.Errorf("%s: no version found by %s", c.file, c.pattern)
			continue
		}
		if got := string(m[1]); got != c.want {
			t.Errorf("%s says %s; the release says %s", c.file, got, c.want)
		}
	}
}
