package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/idemd/idemd/internal/auth"
)

const chart = "helm/idemd"

// kubeVersions are the oldest Kubernetes the chart supports and the newest whose
// schemas kubernetes-validate ships; the rendered objects must be valid in both.
var kubeVersions = []string{"1.30.0", "1.37.0"}

// obj is a rendered Kubernetes object, read loosely.
type obj map[string]any

func (o obj) get(keys ...string) any {
	var v any = map[string]any(o)
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func (o obj) str(keys ...string) string { s, _ := o.get(keys...).(string); return s }
func (o obj) obj(keys ...string) obj    { m, _ := o.get(keys...).(map[string]any); return m }
func (o obj) list(keys ...string) []obj {
	var out []obj
	items, _ := o.get(keys...).([]any)
	for _, it := range items {
		if m, ok := it.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}
func (o obj) int(keys ...string) int { n, _ := o.get(keys...).(int); return n }

// render runs helm template with a values file ("" for the defaults) and returns the
// output and its objects by kind.
func render(t *testing.T, helm, values string, set ...string) (string, map[string][]obj) {
	t.Helper()
	args := []string{"template", "idemd", chart, "--namespace", "platform", "--kube-version", kubeVersions[0]}
	if values != "" {
		args = append(args, "-f", values)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out := run(t, ".", helm, args...)
	objs := map[string][]obj{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		// Into a plain map: yaml.v3 would give nested mappings the type of the outer one.
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("helm template printed YAML that does not parse: %v", err)
		}
		if o != nil {
			objs[obj(o).str("kind")] = append(objs[obj(o).str("kind")], o)
		}
	}
	return out, objs
}

// daemonFlags are the flags of the idemd binary, read from its usage.
func daemonFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, _ := exec.Command(idemd(t), "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["store"] || !flags["shutdown-timeout"] {
		t.Fatalf("idemd -h did not list its flags:\n%s", out)
	}
	return flags
}

func variants(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(chart + "/ci/*-values.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files under %s/ci: %v", chart, err)
	}
	return append([]string{""}, files...)
}

// TestHelmChart lints and renders the chart with its default values and with every
// documented variant, validates the objects against the Kubernetes schemas offline,
// and checks what each variant promises.
func TestHelmChart(t *testing.T) {
	helm := tool(t, "helm", "go install helm.sh/helm/v3/cmd/helm@v3.22.0")
	validate := tool(t, "kubernetes-validate", "pip install kubernetes-validate==1.37.0")
	promtool := tool(t, "promtool", "apt-get install prometheus")
	flags := daemonFlags(t)
	dir := t.TempDir()
	var rendered []string
	for _, values := range variants(t) {
		name := strings.TrimSuffix(path.Base(values), "-values.yaml")
		if values == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			if values == "" {
				// Told nothing about tokens, the chart runs nothing, rather than an open idemd.
				refused(t, helm, []string{"idemctl token new", "auth.open=true"})
				return
			}
			args := []string{"lint", "--strict", chart, "--kube-version", kubeVersions[0]}
			if values != "" {
				args = append(args, "-f", values)
			}
			run(t, ".", helm, args...)
			out, objs := render(t, helm, values)
			file := filepath.Join(dir, name+".yaml")
			if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
				t.Fatal(err)
			}
			rendered = append(rendered, file)
			checkChart(t, objs, flags, promtool)
		})
	}
	// One run for every rendering: the validator's start-up is most of its time. Its
	// errors name the file, which is the variant.
	for _, v := range kubeVersions {
		run(t, ".", validate, append([]string{"--strict", "--quiet", "-k", v}, rendered...)...)
	}
}

// checkChart checks the promises of the chart on one rendering.
func checkChart(t *testing.T, objs map[string][]obj, flags map[string]bool, promtool string) {
	t.Helper()
	workloads := append(slices.Clone(objs["Deployment"]), objs["StatefulSet"]...)
	if len(workloads) != 1 {
		t.Fatalf("%d workloads rendered, want one Deployment or one StatefulSet", len(workloads))
	}
	w := workloads[0]
	pod := w.obj("spec", "template")
	containers := pod.list("spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers", len(containers))
	}
	c := containers[0]
	env := map[string]string{}
	for _, e := range c.list("env") {
		env[e.str("name")] = e.str("value")
	}
	overRedis := w.str("kind") == "Deployment"

	// A Deployment over Redis, or the embedded store on a volume of one replica.
	switch {
	case overRedis && env["IDEMD_STORE"] == "" && !storeFromSecret(c):
		t.Error("a Deployment without IDEMD_STORE would run the embedded store in every replica")
	case overRedis && w.int("spec", "replicas") < 2:
		t.Errorf("over Redis with %d replicas", w.int("spec", "replicas"))
	case !overRedis && (w.int("spec", "replicas") != 1 || len(w.list("spec", "volumeClaimTemplates")) != 1 || env["IDEMD_DATA_DIR"] != "/data"):
		t.Errorf("the embedded store: replicas %d, volume claims %v, IDEMD_DATA_DIR %q", w.int("spec", "replicas"), w.get("spec", "volumeClaimTemplates"), env["IDEMD_DATA_DIR"])
	}
	if n := len(objs["PodDisruptionBudget"]); n != map[bool]int{true: 1, false: 0}[overRedis] {
		t.Errorf("%d PodDisruptionBudgets (over Redis: %v)", n, overRedis)
	}

	// Every variable names a flag, and the daemon parses the literal values; the blob
	// store's credentials, from a Secret, are the AWS SDK's.
	var vars []string
	for name := range env {
		if (name == "AWS_ACCESS_KEY_ID" || name == "AWS_SECRET_ACCESS_KEY") && env[name] == "" {
			continue
		}
		flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "IDEMD_")), "_", "-")
		if !strings.HasPrefix(name, "IDEMD_") || !flags[flag] {
			t.Errorf("the container sets %s, which is no idemd flag", name)
		}
		if v := env[name]; v != "" {
			vars = append(vars, name+"="+v)
		}
	}
	cmd := exec.Command(idemd(t), "--version")
	cmd.Env = append(os.Environ(), vars...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("idemd refuses the rendered environment %v: %v\n%s", vars, err, out)
	}

	// Probes, and a grace period covering the drain.
	scheme := "HTTP"
	if env["IDEMD_TLS_CERT"] != "" {
		scheme = "HTTPS"
	}
	for probe, want := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		if p := c.obj(probe, "httpGet"); p.str("path") != want || p.str("scheme") != scheme || p.str("port") != "http" {
			t.Errorf("%s: %v, want %s over %s", probe, p, want, scheme)
		}
	}
	shutdown, err := time.ParseDuration(env["IDEMD_SHUTDOWN_TIMEOUT"])
	if err != nil {
		t.Fatalf("IDEMD_SHUTDOWN_TIMEOUT: %v", err)
	}
	preStop := c.int("lifecycle", "preStop", "sleep", "seconds")
	if grace := pod.int("spec", "terminationGracePeriodSeconds"); grace != int(shutdown.Seconds())+preStop+5 {
		t.Errorf("terminationGracePeriodSeconds %d; want the shutdown timeout %s + preStop %ds + 5", grace, shutdown, preStop)
	}

	// Non-root, read-only, nothing extra.
	psc, csc := pod.obj("spec", "securityContext"), c.obj("securityContext")
	if psc.get("runAsNonRoot") != true || csc.get("readOnlyRootFilesystem") != true || csc.get("allowPrivilegeEscalation") != false ||
		fmt.Sprint(csc.get("capabilities", "drop")) != "[ALL]" || pod.get("spec", "automountServiceAccountToken") != false {
		t.Errorf("security: pod %v, container %v", psc, csc)
	}

	// The Service reaches the pods.
	svc := objs["Service"]
	if len(svc) != 1 {
		t.Fatalf("%d Services", len(svc))
	}
	podLabels := pod.obj("metadata", "labels")
	for k, v := range svc[0].obj("spec", "selector") {
		if podLabels[k] != v {
			t.Errorf("the Service selects %s=%v, the pods have %v", k, v, podLabels[k])
		}
	}
	if svc[0].list("spec", "ports")[0].str("targetPort") != c.list("ports")[0].str("name") {
		t.Error("the Service's targetPort is not the container's port")
	}

	// The auth file: mounted from a Secret; the chart's own is one idemd loads, and a
	// change of it rolls the pods.
	if file := env["IDEMD_AUTH_FILE"]; file != "" {
		mounted := false
		for _, m := range c.list("volumeMounts") {
			if m.str("mountPath") == path.Dir(file) && m.get("readOnly") == true && m.str("subPath") == "" {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("IDEMD_AUTH_FILE %s is not on a read-only mount of its directory", file)
		}
	}
	// Tokens, or open by choice to the Service's names alone.
	switch hosts := strings.Split(env["IDEMD_ALLOWED_HOSTS"], ","); {
	case (env["IDEMD_AUTH_FILE"] == "") == (env["IDEMD_ALLOWED_HOSTS"] == ""):
		t.Errorf("IDEMD_AUTH_FILE %q, IDEMD_ALLOWED_HOSTS %q: want one of them", env["IDEMD_AUTH_FILE"], env["IDEMD_ALLOWED_HOSTS"])
	case env["IDEMD_ALLOWED_HOSTS"] != "":
		name := objs["Service"][0].str("metadata", "name")
		for _, want := range []string{name, name + ".platform", name + ".platform.svc", name + ".platform.svc.cluster.local"} {
			if !slices.Contains(hosts, want) {
				t.Errorf("open, IDEMD_ALLOWED_HOSTS %q leaves out the Service's name %s", env["IDEMD_ALLOWED_HOSTS"], want)
			}
		}
	}
	for _, s := range objs["Secret"] {
		for key, content := range s.obj("stringData") {
			if _, err := auth.Parse([]byte(content.(string))); err != nil {
				t.Errorf("the auth file in Secret %s (%s) does not load: %v", s.str("metadata", "name"), key, err)
			}
		}
		if pod.str("metadata", "annotations", "checksum/auth") == "" {
			t.Error("the chart's auth Secret changes without rolling the pods")
		}
	}

	// Monitoring: the ServiceMonitor scrapes the Service's port; the PrometheusRule is
	// the rule file, which promtool accepts.
	for _, sm := range objs["ServiceMonitor"] {
		ep := sm.list("spec", "endpoints")[0]
		if ep.str("port") != svc[0].list("spec", "ports")[0].str("name") || ep.str("path") != "/metrics" || ep.str("scheme") != strings.ToLower(scheme) {
			t.Errorf("ServiceMonitor endpoint %v", ep)
		}
	}
	for _, pr := range objs["PrometheusRule"] {
		spec, err := yaml.Marshal(pr.obj("spec"))
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(file, spec, 0o600); err != nil {
			t.Fatal(err)
		}
		run(t, ".", promtool, "check", "rules", file)
		want, _ := os.ReadFile("prometheus/idemd-rules.yaml")
		var a, b any
		_ = yaml.Unmarshal(want, &a)
		_ = yaml.Unmarshal(spec, &b)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Error("the PrometheusRule is not deploy/prometheus/idemd-rules.yaml")
		}
	}
	for _, cm := range objs["ConfigMap"] {
		want, _ := os.ReadFile("grafana/idemd-dashboard.json")
		if got := cm.str("data", "idemd-dashboard.json"); !bytes.Equal(bytes.TrimSpace([]byte(got)), bytes.TrimSpace(want)) {
			t.Error("the dashboard ConfigMap is not deploy/grafana/idemd-dashboard.json")
		}
	}
}

func storeFromSecret(c obj) bool {
	for _, e := range c.list("env") {
		if e.str("name") == "IDEMD_STORE" && e.obj("valueFrom", "secretKeyRef") != nil {
			return true
		}
	}
	return false
}

// refused checks that helm template fails with the values set, saying each of want.
func refused(t *testing.T, helm string, want []string, set ...string) {
	t.Helper()
	args := []string{"template", "idemd", chart, "--namespace", "platform", "--kube-version", kubeVersions[0]}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err == nil {
		t.Fatalf("helm template %v rendered, want a refusal", set)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("helm template %v: %v, want it to say %q\n%s", set, err, w, out)
		}
	}
}

// notes renders the chart's NOTES.txt, which helm template leaves out: through a
// template that quotes it, in a copy of the chart.
func notes(t *testing.T, helm string, set ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "idemd")
	err := filepath.WalkDir(chart, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(chart, p)
		// ReadFile follows the chart's symbolic links into deploy/.
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if rel == filepath.Join("templates", "NOTES.txt") {
			rel = "NOTES.txt"
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "notes.yaml"), []byte(`notes: {{ tpl (.Files.Get "NOTES.txt") . | quote }}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "idemd", dir, "--namespace", "platform", "--kube-version", kubeVersions[0], "--show-only", "templates/notes.yaml"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var rendered struct{ Notes string }
	if err := yaml.Unmarshal([]byte(run(t, ".", helm, args...)), &rendered); err != nil || rendered.Notes == "" {
		t.Fatalf("the notes did not render: %v", err)
	}
	return rendered.Notes
}

// TestHelmChartAuth checks that the chart runs open only when told, then to its
// Service's names, and that its notes say which it does.
func TestHelmChartAuth(t *testing.T) {
	helm := tool(t, "helm", "go install helm.sh/helm/v3/cmd/helm@v3.22.0")
	refused(t, helm, []string{"idemctl token new", "auth.open=true"}, "store.redis.url=redis://r:6379")
	refused(t, helm, []string{"excludes auth.file"}, "auth.open=true", "auth.file=x")
	refused(t, helm, []string{"excludes auth.file"}, "auth.open=true", "auth.existingSecret=y")
	refused(t, helm, []string{`"idemd:8080" is not a host name`}, "auth.open=true", "auth.allowedHosts={idemd:8080}")

	_, objs := render(t, helm, "", "auth.open=true", "auth.allowedHosts={idemd.internal}", "clusterDomain=corp.example")
	env := map[string]string{}
	for _, e := range objs["StatefulSet"][0].list("spec", "template", "spec", "containers")[0].list("env") {
		env[e.str("name")] = e.str("value")
	}
	if want := "idemd,idemd.platform,idemd.platform.svc,idemd.platform.svc.corp.example,idemd.internal"; env["IDEMD_ALLOWED_HOSTS"] != want || env["IDEMD_AUTH_FILE"] != "" {
		t.Errorf("open: IDEMD_ALLOWED_HOSTS %q, IDEMD_AUTH_FILE %q; want %q and none", env["IDEMD_ALLOWED_HOSTS"], env["IDEMD_AUTH_FILE"], want)
	}

	for _, c := range []struct {
		set       []string
		want, not string
	}{
		{[]string{"auth.open=true"}, "running OPEN", "Tokens:"},
		{[]string{"auth.existingSecret=idemd-auth"}, "Tokens: every /v1 call needs one from the auth file in the Secret idemd-auth", "OPEN"},
		{[]string{"auth.file=tokens: []"}, "Tokens: every /v1 call needs one from the auth file of auth.file", "OPEN"},
	} {
		if n := notes(t, helm, c.set...); !strings.Contains(n, c.want) || strings.Contains(n, c.not) {
			t.Errorf("the notes with %v say:\n%s\nwant %q and not %q", c.set, n, c.want, c.not)
		}
	}
}

// TestHelmChartSettings renders single settings and checks where they land.
func TestHelmChartSettings(t *testing.T) {
	helm := tool(t, "helm", "go install helm.sh/helm/v3/cmd/helm@v3.22.0")
	envOf := func(objs map[string][]obj) map[string]obj {
		t.Helper()
		w := append(objs["Deployment"], objs["StatefulSet"]...)[0]
		env := map[string]obj{}
		for _, e := range w.list("spec", "template", "spec", "containers")[0].list("env") {
			env[e.str("name")] = e
		}
		return env
	}

	const tokens = "auth.existingSecret=idemd-auth"
	_, objs := render(t, helm, "", tokens, `store.redis.url=redis+cluster://a:6379\,b:6379`, "replicaCount=4", "config.shutdownTimeoutSeconds=40")
	d := objs["Deployment"]
	if len(d) != 1 || len(objs["StatefulSet"]) != 0 || d[0].int("spec", "replicas") != 4 {
		t.Fatalf("a Redis URL: %d Deployments, %d StatefulSets", len(d), len(objs["StatefulSet"]))
	}
	env := envOf(objs)
	if env["IDEMD_STORE"].str("value") != "redis+cluster://a:6379,b:6379" || env["IDEMD_SHUTDOWN_TIMEOUT"].str("value") != "40s" {
		t.Errorf("env: %v", env)
	}
	// Told nothing, the daemons take the layout of the Redis, and a new one starts lean.
	if layout := env["IDEMD_REDIS_RECORD_LAYOUT"].str("value"); layout != "auto" {
		t.Errorf("IDEMD_REDIS_RECORD_LAYOUT %q by default, want auto", layout)
	}
	if grace := d[0].int("spec", "template", "spec", "terminationGracePeriodSeconds"); grace != 50 {
		t.Errorf("terminationGracePeriodSeconds %d, want 40+5+5", grace)
	}

	_, objs = render(t, helm, "", tokens, "store.redis.existingSecret=redis-url", "store.redis.url=redis://ignored:6379")
	if ref := envOf(objs)["IDEMD_STORE"].obj("valueFrom", "secretKeyRef"); ref.str("name") != "redis-url" || ref.str("key") != "url" {
		t.Errorf("a Secret's URL: %v", ref)
	}

	// An alert on a tenant links to its line in the console, under the console's base URL.
	consoleLink := func(objs map[string][]obj) string {
		t.Helper()
		for _, g := range objs["PrometheusRule"][0].list("spec", "groups") {
			for _, r := range g.list("rules") {
				if r.str("alert") == "IdemdTenantNearQuota" {
					return r.str("annotations", "console")
				}
			}
		}
		t.Fatal("the PrometheusRule has no IdemdTenantNearQuota")
		return ""
	}
	_, objs = render(t, helm, "", tokens, "prometheusRule.enabled=true", "prometheusRule.consoleURL=https://idemd.example.com/")
	if got, want := consoleLink(objs), `{{ reReplaceAll "/+$" "" "https://idemd.example.com/" }}/console/#/tenants/{{ $labels.tenant }}`; got != want {
		t.Errorf("the quota alert's console link is %q, want %q", got, want)
	}
	_, objs = render(t, helm, "", tokens, "prometheusRule.enabled=true")
	if got := consoleLink(objs); !strings.Contains(got, "$externalLabels.idemd_console_url") {
		t.Errorf("without consoleURL, the quota alert's console link is %q, want the external label's", got)
	}
	refused(t, helm, []string{"prometheusRule.consoleURL"}, tokens, "prometheusRule.enabled=true", `prometheusRule.consoleURL=https://x/"`)

	_, objs = render(t, helm, "", tokens, "service.annotations.networking\\.gke\\.io/load-balancer-type=Internal", "service.type=LoadBalancer")
	if s := objs["Service"][0]; s.str("spec", "type") != "LoadBalancer" || s.str("metadata", "annotations", "networking.gke.io/load-balancer-type") != "Internal" {
		t.Errorf("an internal load balancer: %v", s)
	}

	_, objs = render(t, helm, "", tokens, "config.preStopSleepSeconds=0")
	if c := objs["StatefulSet"][0].list("spec", "template", "spec", "containers")[0]; c.get("lifecycle") != nil {
		t.Errorf("preStopSleepSeconds=0 left a preStop hook: %v", c.get("lifecycle"))
	}

	// The blob store: its URL and bounds, and its credentials from a Secret or, without
	// one, none (the pod's identity); a directory of one pod is refused over Redis.
	_, objs = render(t, helm, "", tokens, "store.redis.url=redis://r:6379", "blobStore.url=s3://b/p?region=eu-west-1",
		"blobStore.threshold=131072", "blobStore.credentials.existingSecret=blob-keys", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:x")
	env = envOf(objs)
	if env["IDEMD_BLOB_STORE"].str("value") != "s3://b/p?region=eu-west-1" || env["IDEMD_BLOB_THRESHOLD"].str("value") != "131072" ||
		env["IDEMD_MAX_BLOB_BYTES"].str("value") != "67108864" {
		t.Errorf("a blob store's env: %v", env)
	}
	for name, key := range map[string]string{"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"} {
		if ref := env[name].obj("valueFrom", "secretKeyRef"); ref.str("name") != "blob-keys" || ref.str("key") != key {
			t.Errorf("%s: %v, want the key %s of the Secret blob-keys", name, env[name], key)
		}
	}
	if a := objs["ServiceAccount"][0].str("metadata", "annotations", "eks.amazonaws.com/role-arn"); a != "arn:x" {
		t.Errorf("the ServiceAccount's annotations: %v", objs["ServiceAccount"][0].get("metadata"))
	}
	_, objs = render(t, helm, "", tokens, "store.redis.url=redis://r:6379", "blobStore.url=s3://b/p?region=eu-west-1")
	env = envOf(objs)
	if _, ok := env["AWS_ACCESS_KEY_ID"]; ok || env["IDEMD_BLOB_STORE"].str("value") == "" {
		t.Errorf("a blob store without a Secret of credentials: %v", env)
	}
	_, objs = render(t, helm, "", tokens, "blobStore.url=file:")
	if env = envOf(objs); env["IDEMD_BLOB_STORE"].str("value") != "file:" {
		t.Errorf("the embedded store's blob directory: %v", env)
	}
	// The embedded store keeps large results on its volume unless told none; over
	// Redis there is no blob store unless one is given.
	_, objs = render(t, helm, "", tokens)
	if env = envOf(objs); env["IDEMD_BLOB_STORE"].str("value") != "file:" || env["IDEMD_MAX_BLOB_BYTES"].str("value") != "67108864" {
		t.Errorf("the embedded store's default blob store: %v", env)
	}
	_, objs = render(t, helm, "", tokens, "blobStore.url=none")
	if env = envOf(objs); env["IDEMD_BLOB_STORE"].str("value") != "none" || env["IDEMD_MAX_BLOB_BYTES"] != nil {
		t.Errorf("blobStore.url none: %v", env)
	}
	_, objs = render(t, helm, "", tokens, "store.redis.url=redis://r:6379")
	if _, ok := envOf(objs)["IDEMD_BLOB_STORE"]; ok {
		t.Error("a blob store by default over Redis")
	}
	refused(t, helm, []string{"blobStore.url"}, tokens, "store.redis.url=redis://r:6379", "blobStore.url=file:")

	cmd := exec.Command(helm, "template", "idemd", chart, "--kube-version", kubeVersions[0], "--set", "auth.file=x", "--set", "auth.existingSecret=y")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "exclude each other") {
		t.Errorf("auth.file with auth.existingSecret: %v\n%s", err, out)
	}
}
