// Package docs holds no code: its test checks that every link in the repository to a
// page of the docs, or to a section of one, finds what it names.
package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// skipped are the directories no link is read from: what tools download or build.
var skipped = map[string]bool{".git": true, "node_modules": true, ".venv": true, "target": true, "dist": true, "__pycache__": true}

var (
	// mdLink is a Markdown link, inline: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// pageRef is a page of this repository's named in any text: docs/operations.md,
	// ../../docs/effects.md#the-completer, a runbook URL's path.
	pageRef = regexp.MustCompile(`(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+\.md(?:#[A-Za-z0-9_-]+)?`)
	// sectionRef is a section named in words after its page: `docs/operations.md,
	// Quotas and the store guard` or `docs/operations.md, "The console"`.
	sectionRef = regexp.MustCompile(`(docs/[a-z-]+\.md),\s+(?:"([^"]+)"|([A-Z][^.;:)"\n]*))`)
	heading    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	rowMark    = regexp.MustCompile(`\b[A-Z][0-9]+\b`)
)

// TestLinks reads every text file of the repository and checks each reference to a
// Markdown page: that the page exists, that an #anchor is one of its headings' (as
// GitHub makes them), and that a section named in words after the page is a heading of
// it.
func TestLinks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]*page{} // by path from the root
	var files []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipped[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		// This file names missing pages on purpose, for TestLinksCatch.
		if d.Type().IsRegular() && text(d.Name()) && d.Name() != "links_test.go" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".md") {
			rel, _ := filepath.Rel(root, f)
			pages[filepath.ToSlash(rel)] = readPage(t, f)
			pagesText[filepath.ToSlash(rel)], _ = os.ReadFile(f)
		}
	}
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		rel = filepath.ToSlash(rel)
		for _, problem := range check(rel, data, pages, &checked) {
			t.Error(problem)
		}
	}
	if checked < 100 {
		t.Fatalf("checked only %d references: the reader is broken", checked)
	}
	t.Logf("%d references in %d files checked", checked, len(files))
}

// text says whether a file's links are read: docs, code, configuration.
func text(name string) bool {
	switch filepath.Ext(name) {
	case ".md", ".go", ".yaml", ".yml", ".json", ".ts", ".js", ".py", ".java", ".lua", ".txt", ".html", ".tpl", ".sh", ".toml", ".xml", ".properties":
		return !strings.HasSuffix(name, "package-lock.json")
	}
	return name == "Makefile" || name == "Dockerfile" || name == "run" || name == "deps" || name == "NOTES.txt"
}

type page struct{ anchors, headings []string }

// pagesText holds each page's text, for the rows of its tables.
var pagesText = map[string][]byte{}

func readPage(t *testing.T, path string) *page {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := &page{}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		m := heading.FindStringSubmatch(line)
		if fenced || m == nil {
			continue
		}
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		p.anchors = append(p.anchors, a)
		p.headings = append(p.headings, plain(m[2]))
	}
	return p
}

// slug is the anchor GitHub gives a heading: lower case, letters, digits, spaces made
// hyphens, hyphens and underscores; everything else dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(plain(h)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// plain is a heading's text without Markdown's marks and links' targets.
func plain(h string) string {
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	return strings.NewReplacer("`", "", "*", "").Replace(h)
}

// check answers what is wrong with the references of one file.
func check(rel string, data []byte, pages map[string]*page, checked *int) []string {
	var problems []string
	dir := filepath.ToSlash(filepath.Dir(rel))
	lineOf := func(off int) int { return bytes.Count(data[:off], []byte("\n")) + 1 }
	seen := map[int]bool{}
	if strings.HasSuffix(rel, ".md") {
		for _, m := range mdLink.FindAllSubmatchIndex(data, -1) {
			target := string(data[m[2]:m[3]])
			seen[m[2]] = true
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			*checked++
			file, anchor, _ := strings.Cut(target, "#")
			where := rel
			if file != "" {
				where = filepath.ToSlash(filepath.Clean(filepath.Join(dir, file)))
				if _, err := os.Stat(filepath.Join("..", where)); err != nil && pages[where] == nil {
					problems = append(problems, fmt.Sprintf("%s:%d: links to %s, which does not exist", rel, lineOf(m[0]), target))
					continue
				}
			}
			if anchor != "" {
				if p := pages[where]; p == nil || !slices.Contains(p.anchors, anchor) {
					problems = append(problems, fmt.Sprintf("%s:%d: links to %s, which has no heading #%s", rel, lineOf(m[0]), where, anchor))
				}
			}
		}
	}
	for _, m := range pageRef.FindAllIndex(data, -1) {
		if seen[m[0]] {
			continue
		}
		ref := string(data[m[0]:m[1]])
		file, anchor, _ := strings.Cut(ref, "#")
		where := resolve(file, dir, pages)
		if where == "" {
			if strings.Contains(file, "/") || strings.HasPrefix(file, "docs") {
				problems = append(problems, fmt.Sprintf("%s:%d: names %s, which does not exist", rel, lineOf(m[0]), ref))
			}
			continue
		}
		*checked++
		if anchor != "" && !slices.Contains(pages[where].anchors, anchor) {
			problems = append(problems, fmt.Sprintf("%s:%d: names %s, whose page %s has no heading #%s", rel, lineOf(m[0]), ref, where, anchor))
		}
	}
	// A section named in words: comments and strings wrap it, so their marks go first.
	flat := regexp.MustCompile(`\s*\n\s*(?://|#|--|\*)?\s*`).ReplaceAll(data, []byte(" "))
	for _, m := range sectionRef.FindAllSubmatch(flat, -1) {
		p := pages[string(m[1])]
		name := strings.TrimSpace(string(m[2]) + string(m[3]))
		if p == nil {
			continue // reported above
		}
		*checked++
		// A row of a table of behaviours, named by its mark (C6, "L1 and L2").
		if rows := rowMark.FindAllString(name, -1); len(rows) > 0 && rowMark.ReplaceAllString(name, "") == strings.Repeat(" and ", len(rows)-1) {
			for _, r := range rows {
				if !bytes.Contains(pagesText[string(m[1])], []byte("| "+r+" |")) {
					problems = append(problems, fmt.Sprintf("%s: names the row %s of %s, which has no such row", rel, r, m[1]))
				}
			}
			continue
		}
		found := false
		for _, h := range p.headings {
			if strings.HasPrefix(strings.ToLower(h), strings.ToLower(name)) || strings.HasPrefix(strings.ToLower(name), strings.ToLower(h)) {
				found = true
				break
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: names the section %q of %s, which has no such heading", rel, name, m[1]))
		}
	}
	return problems
}

// resolve finds the page a reference means: relative to the file, or from the root.
func resolve(file, dir string, pages map[string]*page) string {
	for _, c := range []string{filepath.ToSlash(filepath.Clean(filepath.Join(dir, file))), filepath.ToSlash(filepath.Clean(file))} {
		if pages[c] != nil {
			return c
		}
	}
	// A URL's path or a path from elsewhere: the longest suffix that is a page.
	parts := strings.Split(file, "/")
	for i := range parts {
		if c := strings.Join(parts[i:], "/"); pages[c] != nil && strings.Contains(c, "/") {
			return c
		}
	}
	return ""
}

// TestLinksCatch holds the reader to the breaks it exists for: each reference below
// names a page, an anchor, a section or a row that is not there.
func TestLinksCatch(t *testing.T) {
	pages := map[string]*page{"docs/ops.md": {anchors: []string{"backup-and-restore"}, headings: []string{"Backup and restore"}}}
	pagesText["docs/ops.md"] = []byte("# Backup and restore\n| C1 | a row |\n")
	for name, c := range map[string]struct {
		file, text string
		broken     bool
	}{
		"a link to a page that exists":     {"README.md", "[ops](docs/ops.md#backup-and-restore)", false},
		"a link to a missing page":         {"README.md", "[ops](docs/gone.md)", true},
		"a link to a missing anchor":       {"README.md", "[ops](docs/ops.md#restore)", true},
		"a relative link from docs":        {"docs/x.md", "[ops](ops.md#backup-and-restore)", false},
		"an anchor named in code":          {"x.go", `// see docs/ops.md#backup`, true},
		"a section named in words":         {"x.go", `"see docs/ops.md, Backup and restore)"`, false},
		"a missing section named in words": {"x.go", `"see docs/ops.md, Restoring a copy."`, true},
		"a quoted section over two lines":  {"x.go", "// docs/ops.md, \"Backup and\n// restore\"", false},
		"a row that exists":                {"x.go", "docs/ops.md, C1.", false},
		"a row that does not":              {"x.go", "docs/ops.md, C2.", true},
		"a page in a URL":                  {"x.yaml", "https://example.com/blob/main/docs/ops.md#restore", true},
	} {
		var n int
		problems := check(c.file, []byte(c.text), pages, &n)
		if broken := len(problems) > 0; broken != c.broken {
			t.Errorf("%s: problems %q, want broken %v", name, problems, c.broken)
		}
	}
}
