package localenv

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestTransientAPIErrorSortsClientErrors: the error client-go returns for a
// response cut short (what failed a CI run's CRD install) is one to retry; a
// refusal is not.
func TestTransientAPIErrorSortsClientErrors(t *testing.T) {
	create := func(handler http.HandlerFunc) error {
		server := httptest.NewServer(handler)
		defer server.Close()
		c, err := client.New(&rest.Config{Host: server.URL}, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "things.example.com"}}
		return c.Create(context.Background(), crd)
	}
	cut := create(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"kind":`))
	})
	if cut == nil || !transientAPIError(cut) {
		t.Errorf("a response cut short gave %v, want an error to retry", cut)
	}
	refused := create(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422}`))
	})
	if refused == nil || transientAPIError(refused) {
		t.Errorf("a refusal gave %v, want an error not to retry", refused)
	}
}
