// The step-label page: one focused row (a step, or the rating) that j/k move; the row keys follow the focus.
//
// Buttons inside a row carry data-row-key; only the focused row's get data-key, so tandem.js's shortcut handler
// (which clicks the first visible element whose data-key matches) acts on the focused step. "c" / "g" point the
// critique form at the focused step / the whole trajectory and put the cursor in its text box.
(function () {
  "use strict";

  let focused = null;
  let advanceFrom = null; // the focused row when a data-advance button was clicked

  function rows() {
    return Array.from(document.querySelectorAll("[data-focus-row]"));
  }

  function firstUnlabelled(all) {
    const index = all.findIndex(function (row) {
      return row.querySelector(".step-label") && !row.querySelector('.step-label [aria-pressed="true"]');
    });
    return index === -1 ? 0 : index;
  }

  function apply(scroll) {
    const all = rows();
    if (!all.length) return;
    if (focused === null) focused = firstUnlabelled(all);
    focused = Math.max(0, Math.min(focused, all.length - 1));
    all.forEach(function (row, index) {
      const on = index === focused;
      row.classList.toggle("focused", on);
      row.querySelectorAll("[data-row-key]").forEach(function (el) {
        if (on) el.dataset.key = el.dataset.rowKey;
        else delete el.dataset.key;
      });
    });
    if (scroll) all[focused].scrollIntoView({ block: "nearest" });
  }

  function anchorCritique(stepIndex) {
    const select = document.getElementById("critique-anchor");
    const text = document.getElementById("critique-text");
    if (!select || !text) return;
    select.value = stepIndex;
    select.dispatchEvent(new Event("change", { bubbles: true }));
    text.focus();
  }

  document.addEventListener("click", function (event) {
    const move = event.target.closest("[data-focus-move]");
    if (move) {
      focused = (focused || 0) + Number(move.dataset.focusMove);
      apply(true);
      return;
    }
    const row = event.target.closest("[data-focus-row]");
    if (row) {
      focused = rows().indexOf(row);
      apply(false);
    }
    advanceFrom = event.target.closest("[data-advance]") ? focused : null;
    const critique = event.target.closest("[data-critique-step]");
    if (critique) anchorCritique(critique.dataset.critiqueStep);
  });

  // Before tandem.js looks up the pressed key (it listens in the bubbling phase), so a key pressed right after a swap,
  // before htmx has settled and fired htmx:load, still reaches the focused row.
  document.addEventListener(
    "keydown",
    function () {
      apply(false);
    },
    true,
  );

  // The rating is stored by its save button, one revision for a score and a thumb together. The button is on only
  // while a pick is not yet saved, so Enter on the focused rating saves it, and otherwise goes on to submit & next.
  function armRating() {
    const form = document.getElementById("rating");
    const save = form && form.querySelector(".rating-save");
    if (save && !form.dataset.armed) {
      form.dataset.armed = "1";
      save.disabled = true;
      form.addEventListener("change", function () {
        save.disabled = false;
      });
    }
  }

  // A +1 / 0 / -1 on the focused step moves the focus on to the next step once it is stored.
  document.addEventListener("htmx:afterRequest", function (event) {
    if (advanceFrom !== null && event.detail.successful && focused === advanceFrom) {
      focused += 1;
      apply(true);
    }
    advanceFrom = null;
  });

  // Swapped-in controls (a label stored, "first error here", the rating) get the focused row's keys again; a new
  // item (after submit or skip) starts at its first unlabelled step.
  document.addEventListener("htmx:load", function (event) {
    if (event.target.id === "workspace") focused = null;
    armRating();
    apply(false);
  });
  armRating();
  apply(false);
})();
