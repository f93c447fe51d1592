(function () {
  "use strict";
  var filter = document.getElementById("state-filter");
  var rows = document.querySelectorAll("#tasks tbody tr");
  function apply() {
    var want = filter.value;
    for (var i = 0; i < rows.length; i++) {
      rows[i].hidden = want !== "" && rows[i].getAttribute("data-state") !== want;
    }
  }
  if (filter) { filter.addEventListener("change", apply); apply(); }
  function openTarget() {
    var id = window.location.hash.slice(1);
    var el = id ? document.getElementById(id) : null;
    if (el && el.tagName === "DETAILS") { el.open = true; el.scrollIntoView(); }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
})();
