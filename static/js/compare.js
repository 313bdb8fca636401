// The compare page's keys beyond tandem.js's data-key clicks: j/k move between the aligned step rows, Space submits
// (data-key names cannot hold a space), and a chosen radio gives its focus back so the next key press still works.
(function () {
  "use strict";

  let current = -1;

  function typing(target) {
    return target.closest("input:not([type=radio]), textarea, select, [contenteditable=true]") !== null;
  }

  function moveRow(delta) {
    const rows = document.querySelectorAll("#workspace [data-row]");
    if (rows.length === 0) return;
    current = Math.max(0, Math.min(rows.length - 1, current + delta));
    rows.forEach(function (row, index) {
      row.classList.toggle("current-row", index === current);
    });
    rows[current].scrollIntoView({ block: "start", behavior: "instant" });
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("[data-row-step]");
    if (button) moveRow(Number(button.dataset.rowStep));
  });

  document.addEventListener("keydown", function (event) {
    if (event.key !== " " || event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const submit = document.querySelector("#compare-form button[type=submit]");
    if (!submit || submit.disabled) return;
    event.preventDefault();
    submit.click();
  });

  document.addEventListener("change", function (event) {
    if (event.target.matches("#compare-form input[type=radio]")) event.target.blur();
  });

  document.addEventListener("htmx:afterSwap", function () {
    current = -1;
  });
})();
