package archcheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const (
	maxFileLines = 700 // a product file a reader takes in at once
	maxMethods   = 30  // one type, one concern
)

// root is the module's root, from this package's directory.
const root = "../../.."

// productFiles parses every non-test Go file of the module, reporting
// whether each is product code (outside internal/lab).
func productFiles(t *testing.T, fn func(path string, f *ast.File, fset *token.FileSet, product bool)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		full, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		fn(filepath.ToSlash(rel), full, fset, !strings.HasPrefix(filepath.ToSlash(rel), "internal/lab/"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestProductFilesStayShort(t *testing.T) {
	productFiles(t, func(path string, f *ast.File, fset *token.FileSet, product bool) {
		if n := fset.File(f.Pos()).LineCount(); product && n > maxFileLines {
			t.Errorf("%s: %d lines, over %d: split it by job", path, n, maxFileLines)
		}
	})
}

func TestNoTypeHasTooManyMethods(t *testing.T) {
	methods := map[string]int{}
	productFiles(t, func(path string, f *ast.File, _ *token.FileSet, _ bool) {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
				continue
			}
			if name := recvName(fd.Recv.List[0].Type); name != "" {
				methods[filepath.Dir(path)+"."+name]++
			}
		}
	})
	if len(methods) == 0 {
		t.Fatal("no methods found: the walk read nothing")
	}
	for typ, n := range methods {
		if n > maxMethods {
			t.Errorf("%s has %d methods, over %d: it is several types", typ, n, maxMethods)
		}
	}
}

func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// TestSummaryRendersNoRequest: the summary package keeps the hashing
// contract, summaries, index and codec; request rendering lives in
// proxy/prompt, JSON in internal/jsonscan.
func TestSummaryRendersNoRequest(t *testing.T) {
	seen := 0
	productFiles(t, func(path string, f *ast.File, _ *token.FileSet, _ bool) {
		if filepath.Dir(path) != "summary" {
			return
		}
		seen++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "encoding/json" || strings.HasSuffix(p, "/jsonscan") || strings.HasSuffix(p, "/proxy/prompt") {
				t.Errorf("%s imports %s", path, p)
			}
		}
	})
	if seen == 0 {
		t.Fatal("no summary files found")
	}
}
