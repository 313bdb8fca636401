// Span critiques: a text selection inside one field of one step ([data-span-field] inside [data-step-index])
// fills the critique form's hidden span_field / span_start / span_end inputs.
//
// Offsets count characters of the stored text (Unicode code points, as Python counts them), so the field elements
// render the stored text exactly (white-space: pre-wrap, nothing added). A mouse drag and a keyboard selection both
// end in a "selectionchange" event; a selection that leaves its field, or spans two fields, is ignored.
(function () {
  "use strict";

  function byId(id) {
    return document.getElementById(id);
  }

  function fieldOf(node) {
    const element = node.nodeType === Node.ELEMENT_NODE ? node : node.parentElement;
    return element ? element.closest("[data-span-field]") : null;
  }

  function characters(text) {
    return Array.from(text).length; // code points, not UTF-16 units
  }

  function show(spanned) {
    byId("critique-span").hidden = !spanned;
    byId("critique-span-hint").hidden = spanned;
  }

  function setSpan(stepIndex, field, start, end, text) {
    byId("critique-anchor").value = stepIndex;
    byId("critique-span-field").value = field;
    byId("critique-span-start").value = String(start);
    byId("critique-span-end").value = String(end);
    byId("critique-span-where").textContent = field + " of step " + (Number(stepIndex) + 1);
    byId("critique-span-text").textContent = text.length > 160 ? text.slice(0, 157) + "…" : text;
    show(true);
  }

  function clearSpan() {
    if (!byId("critique-form")) return;
    ["critique-span-field", "critique-span-start", "critique-span-end"].forEach(function (id) {
      byId(id).value = "";
    });
    show(false);
  }

  function readSelection() {
    const selection = window.getSelection();
    if (!byId("critique-form") || !selection || selection.rangeCount === 0 || selection.isCollapsed) return;
    const range = selection.getRangeAt(0);
    const field = fieldOf(range.startContainer);
    if (!field || field !== fieldOf(range.endContainer)) return;
    const row = field.closest("[data-step-index]");
    const selected = range.toString();
    if (!row || !selected) return;
    const before = document.createRange();
    before.selectNodeContents(field);
    before.setEnd(range.startContainer, range.startOffset);
    const start = characters(before.toString());
    setSpan(row.dataset.stepIndex, field.dataset.spanField, start, start + characters(selected), selected);
  }

  let pending = null;
  document.addEventListener("selectionchange", function () {
    clearTimeout(pending);
    pending = setTimeout(readSelection, 80);
  });

  document.addEventListener("change", function (event) {
    // Choosing another anchor by hand (or with c / g) drops the span.
    if (event.target.id === "critique-anchor") clearSpan();
  });

  document.addEventListener("click", function (event) {
    if (event.target.closest("[data-clear-span]")) clearSpan();
  });
})();
