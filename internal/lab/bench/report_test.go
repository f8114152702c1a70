package bench

import (
	"strings"
	"testing"
)

func sampleResults() []Result {
	return []Result{
		{Name: "kvmesh", Requests: 10, HitRatio: 0.35, TTFTP50Ms: 120, TTFTsMs: []float64{50, 120, 300, 2000}},
		{Name: "round<robin>", Requests: 9, Errors: 1, ErrorsByKind: map[string]int{"http_503": 1}, HitRatio: 0.11, TTFTP50Ms: 400, TTFTsMs: []float64{80, 400, 9000}},
		{Name: "empty"},
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, sampleResults()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 5 { // header, 3 rows, 1 error line
		t.Fatalf("got %d lines:\n%s", len(lines), out)
	}
	for _, want := range []string{"kvmesh", "0.350", "round<robin>", "round<robin> errors: http_503=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Aligned: every table row has the same width.
	for _, l := range lines[1:4] {
		if len(l) != len(lines[0]) {
			t.Fatalf("rows not aligned:\n%s", out)
		}
	}
}

func TestWriteHTMLReport(t *testing.T) {
	var b strings.Builder
	if err := WriteHTMLReport(&b, sampleResults()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Count(out, "<svg") != 2 || strings.Count(out, "<polyline") != 2 {
		t.Fatalf("want 2 charts and 2 CDF lines:\n%s", out)
	}
	if strings.Contains(out, "round<robin>") || !strings.Contains(out, "round&lt;robin&gt;") {
		t.Fatal("names not escaped")
	}
	for _, banned := range []string{"<script", "src=", "href=", "<link", "@import"} {
		if strings.Contains(out, banned) {
			t.Fatalf("report references external assets (%s)", banned)
		}
	}
	var empty strings.Builder
	if err := WriteHTMLReport(&empty, nil); err != nil || !strings.Contains(empty.String(), "No TTFT samples") {
		t.Fatalf("empty report: %v", err)
	}
}
