// Tandem's small client: keyboard shortcuts and honest failure messages. No build step.
//
// Keyboard: any element with data-key="x" is clicked when "x" is pressed, unless the annotator is typing in a
// field (Escape leaves the field first); Ctrl+Enter in a text box sends its form. Shown in the page's key legend, so
// nothing is hidden.
//
// Failures: 4xx answers carry the re-rendered form with the error beside its field and are swapped in (see the
// htmx-config meta tag in base.html). A 5xx answer or a lost connection swaps nothing, so the form keeps what the
// annotator typed, and a banner says what happened.
(function () {
  "use strict";

  function typing(target) {
    // A radio button or a checkbox takes no text: the keys still work after one is picked.
    const field = target.closest("input, textarea, select, [contenteditable=true]");
    return field !== null && !field.matches("[type=radio], [type=checkbox]");
  }

  function visible(el) {
    return el.offsetParent !== null && !el.disabled;
  }

  document.addEventListener("keydown", function (event) {
    // Ctrl+Enter (Cmd+Enter on a Mac) in a text box sends its form, as in a chat or a code review.
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && event.target.matches("textarea")) {
      const form = event.target.form;
      if (form) {
        event.preventDefault();
        form.requestSubmit();
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event.target)) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    const target = Array.from(document.querySelectorAll("[data-key]")).find(function (el) {
      return el.dataset.key.split(" ").includes(key) && visible(el);
    });
    if (!target) return;
    event.preventDefault();
    if (target.matches("input, textarea, select")) target.focus();
    else target.click();
  });

  // A form with data-confirm="question" is sent only once the question is answered yes (a re-run launches a run).
  document.addEventListener("submit", function (event) {
    const question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });

  function flash(text) {
    const box = document.getElementById("flash");
    if (!box) return;
    box.textContent = text;
    box.hidden = false;
  }

  document.addEventListener("htmx:responseError", function (event) {
    const status = event.detail.xhr.status;
    flash("The server failed (" + status + "). Nothing you typed is lost: press submit again to retry.");
  });
  document.addEventListener("htmx:sendError", function () {
    flash("No connection to the server. Nothing you typed is lost: press submit again when you are back online.");
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.successful) {
      const box = document.getElementById("flash");
      if (box) box.hidden = true;
    }
  });
})();
